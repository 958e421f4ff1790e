package inventory

import (
	"context"

	"github.com/dropline/dropline/inventory/core"
	"github.com/dropline/dropline/inventory/script"
)

// SetRebuildPublishedHook makes fn run after each rebuild of e publishes its
// SKU, before the rebuild's snapshot transaction ends: where a test makes
// that transaction fail.
func SetRebuildPublishedHook(e *Engine, fn func(sku string)) { e.rebuildPublished = fn }

// ContinueWalkOnce takes sku's unfinished waitlist walk one run of
// continue_walk.lua further, where FinishWalk runs it until the walk ends,
// and says whether the walk is still unfinished after the run and how many
// offers the run made: for tests that check what a single run does.
func (e *Engine) ContinueWalkOnce(ctx context.Context, sku string) (pending bool, offers int, err error) {
	res, err := script.RunContinueWalk(ctx, e.core.Run, e.keys,
		script.ContinueWalk{Partition: e.keys.PartitionOf(sku), SKU: sku, Nonce: core.NewNonce()})
	if err != nil {
		return false, 0, err
	}
	return core.ReplyCode(res.Code) == core.CodePending, res.Offers, nil
}
