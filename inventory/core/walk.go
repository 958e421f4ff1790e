package core

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
// FinishWalk, then the same request again).

// maxWalkRuns bounds the runs of continue_walk.lua one finishWalk makes:
// each run examines at least one entry and the queue is bounded
// (Config.WaitlistMax), so a walk ends well within it unless releases keep
// starting it again; the caller then answers ErrUnavailable (retry) rather
// than wait without end.
const maxWalkRuns = 10_000

// FinishWalk runs continue_walk.lua for sku of partition p until its walk
// has ended, and returns how many offers it made: the hand-off of a reserve
// or a cart line that found the walk unfinished.
func (c *Core) FinishWalk(ctx context.Context, p int, sku string) (int, error) {
	offers := 0
	for range maxWalkRuns {
		res, err := script.RunContinueWalk(ctx, c.Run, c.Keys, script.ContinueWalk{Partition: p, SKU: sku, Nonce: NewNonce()})
		if err != nil {
			return offers, fmt.Errorf("walking the waitlist of %s: %w", sku, err)
		}
		offers += res.Offers
		if ReplyCode(res.Code) != CodePending {
			return offers, nil
		}
	}
	return offers, Unavailable("walking the waitlist of "+sku, errors.New("the walk keeps starting again"))
}

// ContinueWalks finishes the unfinished waitlist walks of every partition,
// up to limit SKUs per partition, and returns how many offers they made.
// It takes no lease: every run of continue_walk.lua is one atomic step from
// where the walk stopped, so any number of processes may continue walks at
// once. One SKU that fails does not keep the others from their walks.
func (c *Core) ContinueWalks(ctx context.Context, limit int) (int, error) {
	cmds := make([]*redis.StringSliceCmd, script.Partitions)
	_, err := c.Redis.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		for p := range script.Partitions {
			cmds[p] = pipe.ZRange(ctx, c.Keys.Walks(p), 0, int64(limit)-1)
		}
		return nil
	})
	if err != nil {
		return 0, Unavailable("listing unfinished waitlist walks", err)
	}
	offers := 0
	var errs []error
	for p, cmd := range cmds {
		for _, sku := range cmd.Val() {
			n, err := c.FinishWalk(ctx, p, sku)
			offers += n
			if err != nil {
				errs = append(errs, err)
			}
		}
	}
	return offers, errors.Join(errs...)
}

// MaxWalkRetries bounds how often one reserve or cart finishes a walk and
// asks again: each time, a release since may have started a new walk.
const MaxWalkRetries = 5

// ErrWalkRestarts is why a reserve or a cart gives up after MaxWalkRetries.
var ErrWalkRestarts = errors.New("the SKU's waitlist walk was started again each time it ended")
