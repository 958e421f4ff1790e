package queue

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/dropline/dropline/db"
	"github.com/dropline/dropline/inventory"
)

// restoreTimeout bounds one restore, the ledger's row lock included.
const restoreTimeout = time.Minute

// restoreBatch is how many tickets one restore_queue.lua chunk writes.
const restoreBatch = 1000

// Restore loads queue r into Redis from the ledger when Redis does not have
// it: a new queue's settings, or, after Redis lost its data, the queue as
// the ledger has it (the write-behind records every join, numbering,
// admission and spent pass): each ticket's number (the pre-queue's members
// unnumbered before the opening), the last number admitted, the passes with
// their state (only those neither spent nor expired count against the
// stock), and how far the opening's numbering went (a numbering cut short
// is finished by the next Step, from the same seed and members). It is a
// no-op when Redis has the queue. What never reached the ledger is lost with
// Redis, as holds are: a join (its principal joins again, at the end), an
// admission (its numbers are admitted again, with new passes), a spending
// (the pass is unspent again; the hold it bought is lost too).
//
// The snapshot is read under the queue's ledger row lock, which the
// write-behind's batches of the queue take first, and written before it is
// released, in chunks (no script blocks Redis for long); the queue's hash is
// written last and makes it live. Concurrent restores in this process share
// one; across processes the row lock serialises them, and the second finds
// the queue live. The engine's rebuild of a queued SKU restores its queue
// before the SKU goes live, so a reserve never finds the SKU without the
// passes.
func (s *Service) Restore(ctx context.Context, r Ref) error {
	_, err, _ := s.restores.Do(r.String(), func() (any, error) {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), restoreTimeout)
		defer cancel()
		return nil, s.restoreOnce(ctx, r)
	})
	return err
}

// RestoreID is Restore by the queue's id ("sku:<sku>" or "drop:<drop>"),
// as the engine's rebuild of a queued SKU calls it.
func (s *Service) RestoreID(ctx context.Context, id string) error {
	r, ok := ParseRef(id)
	if !ok {
		return fmt.Errorf("restoring queue %q: not a queue id", id)
	}
	return s.Restore(ctx, r)
}

func (s *Service) restoreOnce(ctx context.Context, r Ref) error {
	k := keysOf(s.keys, r)
	if n, err := s.rdb.Exists(ctx, k.queue).Result(); err != nil {
		return fmt.Errorf("restoring %s: %w: %w", r, errUnavailable, err)
	} else if n == 1 {
		return nil
	}
	start := time.Now()
	tickets := 0
	err := s.ledger.Queues().WithQueueSnapshot(ctx, r.String(), func(snap *db.QueueSnapshot) error {
		q, p := snap.Queue, snap.Progress
		state, pre, numbered := "pre", int64(0), int64(0)
		if p.PreQueueSize >= 0 || p.LastNumber > 0 {
			// Closed: numbering the pre-queue, or open once every member of
			// it has its number.
			pre, numbered = p.PreQueue, p.Numbered
			state = "open"
			if numbered < pre {
				state = "numbering"
			}
		}
		next := max(p.LastNumber, pre)
		first := true
		var batch []any
		flush := func() error {
			if len(batch) == 0 && !first {
				return nil
			}
			ok, err := s.scripts.runRestoreChunk(ctx, s.rdb, k, first, state, batch)
			if err != nil {
				return fmt.Errorf("restoring %s: %w", r, err)
			}
			if !ok {
				return errRestored
			}
			first, batch = false, batch[:0]
			return nil
		}
		err := snap.Tickets(ctx, restoreBatch, func(ts []db.QueueTicket) error {
			for _, t := range ts {
				preFlag, exp, st := "0", int64(0), "A"
				if t.PreQueue {
					preFlag = "1"
				}
				if t.PassExpiresAt != nil {
					exp = t.PassExpiresAt.UnixMilli()
				}
				if t.SpentAt != nil {
					st = "U"
				}
				batch = append(batch, t.Principal, t.Number, preFlag, t.Pass, exp, st)
				tickets++
			}
			return flush()
		})
		if err != nil {
			return err
		}
		if err := flush(); err != nil { // an empty queue's first chunk still clears what was left
			return err
		}
		_, err = s.scripts.runRestorePublish(ctx, s.rdb, k, publishArgs{OpensAt: q.OpensAt, AdmitPerMinute: q.AdmitPerMinute,
			PassLife: time.Duration(q.PassSeconds) * time.Second, State: state, Pre: pre, Next: next, Numbered: numbered,
			Through: p.AdmittedThrough})
		if err != nil {
			return fmt.Errorf("restoring %s: %w", r, err)
		}
		return nil
	})
	switch {
	case errors.Is(err, errRestored):
		return nil
	case errors.Is(err, db.ErrNotFound):
		return &inventory.NotFoundError{Kind: "queue", Key: r.String(), Field: string(r.Kind)}
	case errors.Is(err, inventory.ErrUnavailable):
		return err
	case err != nil:
		return fmt.Errorf("restoring %s: %w: %w", r, errUnavailable, err)
	}
	s.restored.Add(int64(tickets))
	s.restoreTime.Add(int64(time.Since(start)))
	return nil
}

// errRestored stops a restore that finds the queue live meanwhile.
var errRestored = errors.New("queue loaded meanwhile")
