package worker

import (
	"context"
	"fmt"

	"github.com/dropline/dropline/inventory"
)

// Reasons an entry is moved to the dead-letter stream.
const (
	deadMalformed    = "malformed"
	deadUnknownKind  = "unknown_kind"
	deadNewerVersion = "newer_version"
	deadRefused      = "refused"
)

// refuse counts the refusals of events Postgres refused alone and
// dead-letters those refused RefuseLimit times; the others stay pending.
func (f *Flusher) refuse(ctx context.Context, p int, refused []inventory.OutboxEntry) error {
	if len(f.refusals) > 10*f.cfg.BatchSize {
		clear(f.refusals) // entries another process took over; start counting afresh
	}
	var dead []inventory.DeadLetter
	for _, e := range refused {
		f.refusals[e.ID]++
		if f.cfg.RefuseLimit > 0 && f.refusals[e.ID] >= f.cfg.RefuseLimit {
			dead = append(dead, inventory.DeadLetter{Entry: e, Reason: deadRefused,
				Err: fmt.Errorf("refused by Postgres %d times: event %s", f.refusals[e.ID], e.Event.ID)})
		}
	}
	if err := f.deadLetter(ctx, p, dead); err != nil {
		return err
	}
	for _, d := range dead {
		delete(f.refusals, d.Entry.ID)
	}
	return nil
}

// deadLetter moves entries out of the way of the flow, into partition p's
// dead-letter stream (inventory.Outbox.DeadLetter), and logs and counts each.
func (f *Flusher) deadLetter(ctx context.Context, p int, dead []inventory.DeadLetter) error {
	if len(dead) == 0 {
		return nil
	}
	sctx, cancel := stepContext(ctx, f.cfg.StepTimeout)
	defer cancel()
	if err := f.outbox.DeadLetter(sctx, p, dead); err != nil {
		return err
	}
	for _, d := range dead {
		f.m.deadLettered.WithLabelValues(d.Reason).Inc()
		f.log.Error().Err(d.Err).Int("partition", p).Str("entry", d.Entry.ID).Str("reason", d.Reason).
			Str("dead_letters", f.engine.Keys().DeadLetters(p)).
			Msg("outbox entry cannot be applied; moved to the dead-letter stream, the rest of the flow goes on")
	}
	return nil
}
