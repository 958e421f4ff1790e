package worker

import (
	"context"

	"github.com/dropline/dropline/inventory"
)

// claimAll takes over events pending longer than ClaimIdle on any consumer
// of the owned partitions, and applies them. A partition that fails backs
// off like in pass; the others go on.
func (f *Flusher) claimAll(ctx context.Context, state *[inventory.Partitions]partitionState) int {
	total := 0
	for p := range inventory.Partitions {
		st := &state[p]
		if !f.leases.Held(p) || !st.due() {
			continue
		}
		n, err := f.claimPartition(ctx, p)
		total += n
		if err != nil {
			f.settle(ctx, p, st, err)
		}
	}
	return total
}

func (f *Flusher) claimPartition(ctx context.Context, p int) (int, error) {
	total := 0
	start := "0-0"
	for range 10 { // bounded per pass; the next pass goes on
		sctx, cancel := stepContext(ctx, f.cfg.StepTimeout)
		entries, next, err := f.outbox.Claim(sctx, p, f.cfg.ClaimIdle, start, f.cfg.BatchSize)
		cancel()
		if err != nil {
			return total, err
		}
		if len(entries) > 0 {
			f.m.claimed.Add(float64(len(entries)))
			f.log.Info().Int("partition", p).Int("events", len(entries)).Msg("claimed pending events from an idle consumer")
			if _, err := f.apply(ctx, p, entries); err != nil {
				return total, err
			}
			total += len(entries)
		}
		if next == "0-0" || next == "" {
			break
		}
		start = next
	}
	return total, nil
}
