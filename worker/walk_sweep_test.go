package worker

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/internal/testenv"
	"github.com/dropline/dropline/inventory"
)

// A release on a SKU with 3,000 waiters who do not fit leaves the walk
// unfinished after its bounded run; the group's walk sweep takes it to the
// end, so the one waiter who fits, at the back, is offered the unit within
// about one sweep Interval, and the walk leaves the set of unfinished walks.
func TestWalkSweepFinishesAnUnfinishedWalk(t *testing.T) {
	testenv.Quiet(t)
	const n = 3000
	b := setup(t)
	b.product(t, "WALK-SWEEP", 1)
	hold, err := b.engine.Reserve(b.ctx, inventory.Principal{ID: "holder"}, inventory.ReserveRequest{SKU: "WALK-SWEEP", Quantity: 1})
	require.NoError(t, err)
	errs := make([]error, 8)
	var wg sync.WaitGroup
	for g := range errs {
		wg.Go(func() {
			for i := g; i < n; i += len(errs) {
				_, err := b.engine.Waitlists().JoinWaitlist(b.ctx, inventory.Principal{ID: fmt.Sprintf("big-%d", i)},
					inventory.JoinWaitlistRequest{SKU: "WALK-SWEEP", Quantity: 2})
				errs[g] = errors.Join(errs[g], err)
			}
		})
	}
	wg.Wait()
	require.NoError(t, errors.Join(errs...))
	last := inventory.Principal{ID: "last"}
	_, err = b.engine.Waitlists().JoinWaitlist(b.ctx, last, inventory.JoinWaitlistRequest{SKU: "WALK-SWEEP", Quantity: 1})
	require.NoError(t, err)

	g, reg := b.startGroup(t, fastConfig("solo"))
	released := time.Now()
	_, err = b.engine.Cancel(b.ctx, inventory.Principal{ID: "holder"}, hold.Token)
	require.NoError(t, err)
	walks := b.engine.Keys().Walks(b.engine.Keys().PartitionOf("WALK-SWEEP"))
	eventually(t, 5*time.Second, func() bool {
		w, err := b.engine.Waitlists().Waitlist(b.ctx, last, "WALK-SWEEP")
		require.NoError(t, err)
		return w.Status == inventory.WaitOffered
	}, "the waiter at the back is offered the unit")
	took := time.Since(released)
	t.Logf("the walk past %d waiters ended with its offer %s after the cancel", n, took)
	require.Less(t, took, 2*time.Second, "within a few sweep intervals")
	left, err := b.rdb.ZCard(b.ctx, walks).Result()
	require.NoError(t, err)
	require.Zero(t, left, "no walk is left unfinished")
	require.Equal(t, float64(1), metric(t, reg, "dropline_waitlist_walk_offers_total"), "the sweep made the offer")
	s := b.stock(t, "WALK-SWEEP")
	require.Equal(t, 1, s.Held)
	require.Zero(t, s.Available)
	stop(t, g.Group)
}
