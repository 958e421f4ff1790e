package worker

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/internal/testenv"
	"github.com/dropline/dropline/inventory"
	"github.com/dropline/dropline/inventory/queue"
)

// TestAdmissionGoesOnWhenItsInstanceDies: two instances run the admission
// ticker; the one holding the queue's partition is killed mid-drop (its
// lease left to expire). The other takes the partition and admits the rest,
// in ticket order; every unit is sold once, each to an admitted buyer with
// its pass, and the queue ends SOLD_OUT.
func TestAdmissionGoesOnWhenItsInstanceDies(t *testing.T) {
	testenv.Quiet(t)
	b := setup(t)
	const units, people = 40, 60
	_, err := b.engine.Catalog().CreateProduct(b.ctx, admin, inventory.ProductInput{
		SKU: "Q-DROP", Name: "Queued drop", Price: inventory.Money{Amount: 100, Currency: "EUR"}, Stock: units,
		Queue: &inventory.QueueSettings{OpensAt: time.Now().Add(-time.Second), AdmitPerMinute: 600},
	})
	require.NoError(t, err)
	r := queue.Ref{Kind: queue.OfProduct, ID: "Q-DROP"}
	qs := queue.New(queue.Config{}, b.rdb, b.engine)
	for i := range people {
		tk, err := qs.Join(b.ctx, fmt.Sprintf("p-%02d", i), r, queue.JoinInput{})
		require.NoError(t, err)
		require.Equal(t, int64(i+1), tk.Number)
	}

	ga, _ := b.startGroup(t, fastConfig("a"))
	gb, _ := b.startGroup(t, fastConfig("b"))
	bought := map[string]bool{}
	killed := false
	kill := func() {
		victim := ga
		if gb.Admitter.leases.Held(r.Partition()) {
			victim = gb
		}
		victim.kill(t)
		killed = true
		t.Logf("killed the admitting instance after %d sales", len(bought))
	}
	var lastThrough int64
	deadline := time.Now().Add(40 * time.Second)
	for len(bought) < units {
		require.True(t, time.Now().Before(deadline), "only %d of %d sold", len(bought), units)
		for i := range people {
			who := fmt.Sprintf("p-%02d", i)
			tk, _, err := qs.MyTicket(b.ctx, who, r)
			require.NoError(t, err)
			require.GreaterOrEqual(t, tk.AdmittedThrough, lastThrough, "admission never goes back")
			lastThrough = tk.AdmittedThrough
			if tk.Status != queue.TicketAdmitted {
				require.False(t, tk.Number <= tk.AdmittedThrough && !bought[who] && tk.Status == queue.TicketWaiting)
				continue
			}
			p := inventory.Principal{ID: who}
			h, err := b.engine.Reserve(b.ctx, p, inventory.ReserveRequest{SKU: "Q-DROP", Quantity: 1, AdmissionPass: tk.Pass})
			require.NoError(t, err, "%s admitted with %d units for %d passes", who, units-len(bought), tk.AdmittedThrough-int64(len(bought)))
			_, err = b.engine.Commit(b.ctx, p, h.Token)
			require.NoError(t, err)
			bought[who] = true
			if !killed && len(bought) >= units/4 {
				kill()
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	for i := range units {
		require.True(t, bought[fmt.Sprintf("p-%02d", i)], "ticket %d was admitted before later ones", i+1)
	}
	s, err := b.engine.Catalog().Stock(b.ctx, "Q-DROP")
	require.NoError(t, err)
	require.Equal(t, units, s.Sold)
	require.Equal(t, 0, s.Held)
	require.Eventually(t, func() bool {
		tk, _, err := qs.MyTicket(b.ctx, fmt.Sprintf("p-%02d", people-1), r)
		return err == nil && tk.Status == queue.TicketSoldOut
	}, 5*time.Second, 50*time.Millisecond, "the waiters learn SOLD_OUT")
	_, err = b.engine.Reserve(b.ctx, inventory.Principal{ID: "p-59"}, inventory.ReserveRequest{SKU: "Q-DROP", Quantity: 1})
	require.ErrorIs(t, err, inventory.ErrQueueRequired)
}
