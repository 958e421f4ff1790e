package queue_test

import (
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/inventory"
	"github.com/dropline/dropline/inventory/queue"
)

// TestQueueJoinBatches: thousands of principals join at once, each twice,
// so their joins reach Redis in batches; one queue holds fewer tickets than
// there are principals, another closes its pre-queue while the joins go
// on. Every rule holds as for joins one at a time: one ticket per
// principal (the second join answers the first's ticket), numbers dense and
// each once, nobody past the queue's size, the pre-queue's members numbered
// from the seed and everyone after them first come, first served; in Redis
// and in the ledger, row by row.
func TestQueueJoinBatches(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		b := setup(t, backend)
		const people, most = 3000, 2000
		small := queue.New(queue.Config{Secret: []byte("a test secret of thirty-two bytes!"), MaxTickets: most}, b.rdb, b.engine)
		fifo := b.queuedProduct(t, "Q-BATCH", 10, inventory.QueueSettings{OpensAt: time.Now().Add(-time.Second), AdmitPerMinute: 60})
		pre := b.queuedProduct(t, "Q-BATCH-PRE", 10, inventory.QueueSettings{OpensAt: time.Now().Add(time.Hour), AdmitPerMinute: 60})
		preSet := b.engine.Keys().Base(pre.Partition()) + "qpre:" + pre.String()

		type result struct {
			tk   queue.Ticket
			full bool
		}
		results := [2][]result{make([]result, 2*people), make([]result, 2*people)}
		var opened atomic.Bool
		err := goAll(4*people+1, func(i int) error {
			if i == 4*people {
				// The opening comes while the joins go on: once a third of
				// the principals are in the pre-queue.
				for range 2000 {
					if n, err := b.rdb.SCard(b.ctx, preSet).Result(); err != nil {
						return err
					} else if n >= people/3 {
						break
					}
					time.Sleep(time.Millisecond)
				}
				// As b.open, off the test goroutine.
				if _, err := b.pool.Exec(b.ctx, `UPDATE queues SET opens_at = now() - interval '1 second' WHERE id = $1`, pre.String()); err != nil {
					return err
				}
				q := b.engine.Keys().Base(pre.Partition()) + "q:" + pre.String()
				if err := b.rdb.HSet(b.ctx, q, "opens", time.Now().Add(-time.Second).UnixMilli()).Err(); err != nil {
					return err
				}
				opened.Store(true)
				return nil
			}
			q, j := i/(2*people), i%(2*people)
			who := buyer(j % people).ID
			var tk queue.Ticket
			var err error
			if q == 0 {
				tk, err = small.Join(b.ctx, who, fifo, queue.JoinInput{})
			} else {
				tk, err = b.queues.Join(b.ctx, who, pre, queue.JoinInput{})
			}
			if errors.Is(err, inventory.ErrQueueFull) && q == 0 {
				results[q][j].full = true
				return nil
			}
			if err == nil && (tk.Number == 0) != (tk.Status == queue.TicketPreQueue) {
				err = fmt.Errorf("%s: ticket %+v", who, tk)
			}
			results[q][j].tk = tk
			return err
		})
		require.NoError(t, err)
		require.True(t, opened.Load())
		batches, joins := small.JoinBatchStats()
		require.EqualValues(t, 2*people, joins)
		require.Less(t, batches, joins, "joins went to Redis together")

		// The small queue: exactly most principals have a ticket, each one,
		// numbered 1..most; the others were told the queue is full, twice.
		holders := 0
		for j := range people {
			a, c := results[0][j], results[0][j+people]
			if a.full || c.full {
				require.True(t, a.full && c.full, "%s: a full queue is full for both joins", buyer(j).ID)
				continue
			}
			holders++
			require.Positive(t, a.tk.Number)
			require.Equal(t, a.tk.Number, c.tk.Number, "%s joined twice, one ticket", buyer(j).ID)
			require.True(t, a.tk.Replayed != c.tk.Replayed, "%s: one join gave the ticket, the other answered it", buyer(j).ID)
		}
		require.Equal(t, most, holders)
		b.drain(t)
		st := b.queueState(t, fifo)
		require.Len(t, st.Numbers, most)
		require.EqualValues(t, most, st.Next, "numbers 1..most, dense")
		b.requireLedgerAgrees(t, fifo, st)

		// The pre-queue: those who joined before the closing have no number
		// until the step numbers them; those after are numbered at once.
		var members []string
		late := map[string]int64{}
		for j := range people {
			a, c := results[1][j], results[1][j+people]
			who := buyer(j).ID
			require.True(t, a.tk.Replayed != c.tk.Replayed, "%s: one join gave the ticket, the other answered it", who)
			require.Equal(t, a.tk.Number, c.tk.Number, "%s joined twice, one ticket", who)
			if a.tk.Number == 0 {
				members = append(members, who)
			} else {
				late[who] = a.tk.Number
			}
		}
		require.GreaterOrEqual(t, len(members), people/3)
		b.admit(t, pre, 0)
		settings, err := b.queues.Settings(b.ctx, pre)
		require.NoError(t, err)
		require.NotNil(t, settings.Seed)
		st = b.queueState(t, pre)
		require.Len(t, st.Numbers, people)
		require.EqualValues(t, people, st.Next)
		for i, who := range queue.PreQueueOrder(settings.Seed, members) {
			require.Equal(t, int64(i+1), st.Numbers[who], "%s is numbered from the seed", who)
		}
		for who, n := range late {
			require.Greater(t, n, int64(len(members)), "%s joined after the closing", who)
			require.Equal(t, n, st.Numbers[who])
		}
		b.drain(t)
		b.requireLedgerAgrees(t, pre, st)
		pb, pj := b.queues.JoinBatchStats()
		t.Logf("%s: %d joins in %d batches (%d in %d); %d of %d principals in the pre-queue",
			backend, joins, batches, pj, pb, len(members), people)
	})
}
