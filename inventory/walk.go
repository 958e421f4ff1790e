package inventory

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/dropline/dropline/inventory/script"
)

// A SKU's waitlist walk (walk in lua/lib.lua) hands freed units to its
// waiters in join order. One script run examines a bounded number of
// entries, so a long queue whose waiters do not fit never blocks Redis; a
// walk left unfinished is recorded in its SKU's stock hash and in its
// partition's set of unfinished walks (Keys.Walks), and is taken further by
// continue_walk.lua: by the worker group's walk sweep (ContinueWalks), and
// by a reserve or a cart line that finds it unfinished (WALK_PENDING:
// finishWalk, then the same request again).

// maxWalkRuns bounds the runs of continue_walk.lua one finishWalk makes:
// each run examines at least one entry and the queue is bounded
// (Config.WaitlistMax), so a walk ends well within it unless releases keep
// starting it again; the caller then answers ErrUnavailable (retry) rather
// than wait without end.
const maxWalkRuns = 10_000

// finishWalk runs continue_walk.lua for sku of partition p until its walk
// has ended, and returns how many offers it made.
func (e *Engine) finishWalk(ctx context.Context, p int, sku string) (int, error) {
	offers := 0
	for range maxWalkRuns {
		res, err := script.RunContinueWalk(ctx, e.run, e.keys, script.ContinueWalk{Partition: p, SKU: sku, Nonce: newNonce()})
		if err != nil {
			return offers, fmt.Errorf("walking the waitlist of %s: %w", sku, err)
		}
		offers += res.Offers
		if replyCode(res.Code) != codePending {
			return offers, nil
		}
	}
	return offers, unavailable("walking the waitlist of "+sku, errors.New("the walk keeps starting again"))
}

// ContinueWalks finishes the unfinished waitlist walks of every partition,
// up to limit SKUs per partition, and returns how many offers they made.
// It takes no lease: every run of continue_walk.lua is one atomic step from
// where the walk stopped, so any number of processes may continue walks at
// once. One SKU that fails does not keep the others from their walks.
func (m *Maintenance) ContinueWalks(ctx context.Context, limit int) (int, error) {
	e := m.e
	cmds := make([]*redis.StringSliceCmd, Partitions)
	_, err := e.rdb.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		for p := range Partitions {
			cmds[p] = pipe.ZRange(ctx, e.keys.Walks(p), 0, int64(limit)-1)
		}
		return nil
	})
	if err != nil {
		return 0, unavailable("listing unfinished waitlist walks", err)
	}
	offers := 0
	var errs []error
	for p, c := range cmds {
		for _, sku := range c.Val() {
			n, err := e.finishWalk(ctx, p, sku)
			offers += n
			if err != nil {
				errs = append(errs, err)
			}
		}
	}
	return offers, errors.Join(errs...)
}

// maxWalkRetries bounds how often one reserve or cart finishes a walk and
// asks again: each time, a release since may have started a new walk.
const maxWalkRetries = 5

var errWalkRestarts = errors.New("the SKU's waitlist walk was started again each time it ended")
