package queue_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/db"
	"github.com/dropline/dropline/inventory"
	"github.com/dropline/dropline/inventory/queue"
)

// drain applies every outbox event of every partition to the ledger, as the
// write-behind does, then trims what it applied; it returns the events by
// kind.
func (b *bundle) drain(t testing.TB) map[string]int {
	t.Helper()
	kinds := map[string]int{}
	for p := range inventory.Partitions {
		stream := b.engine.Keys().Outbox(p)
		msgs, err := b.rdb.XRange(b.ctx, stream, "-", "+").Result()
		require.NoError(t, err)
		if len(msgs) == 0 {
			continue
		}
		events := make([]db.Event, 0, len(msgs))
		ids := make([]string, 0, len(msgs))
		for _, m := range msgs {
			ids = append(ids, m.ID)
			ev, err := inventory.ParseEvent(m)
			require.NoError(t, err)
			require.NoError(t, ev.Validate())
			events = append(events, ev)
			kinds[ev.Kind]++
		}
		require.NoError(t, b.engine.Ledger().ApplyEvents(b.ctx, nil, events))
		require.NoError(t, b.rdb.XDel(b.ctx, stream, ids...).Err())
	}
	return kinds
}

// queueState is a queue's Redis state, as a rebuild must restore it: each
// principal's number and pass ("pass|expires_ms|state|number"), the
// admitted number, the last number given, the numbering's progress, and the
// principals whose pass counts against the stock.
type queueState struct {
	Numbers                 map[string]int64
	Passes                  map[string]string
	Through, Next, Numbered int64
	State                   string
	Live                    []string
}

func (b *bundle) queueState(t testing.TB, r queue.Ref) queueState {
	t.Helper()
	base := b.engine.Keys().Base(r.Partition()) // every key of the queue lives in its partition
	id := r.String()
	who, err := b.rdb.HGetAll(b.ctx, base+"qwho:"+id).Result()
	require.NoError(t, err)
	passes, err := b.rdb.HGetAll(b.ctx, base+"qpass:"+id).Result()
	require.NoError(t, err)
	h, err := b.rdb.HMGet(b.ctx, base+"q:"+id, "through", "next", "numbered", "state").Result()
	require.NoError(t, err)
	live, err := b.rdb.ZRangeByScore(b.ctx, base+"qlive:"+id, &redis.ZRangeBy{Min: strconv.FormatInt(time.Now().UnixMilli(), 10), Max: "+inf"}).Result()
	require.NoError(t, err)
	st := queueState{Numbers: map[string]int64{}, Passes: passes, Live: live}
	for p, n := range who {
		st.Numbers[p], _ = strconv.ParseInt(n, 10, 64)
	}
	num := func(v any) int64 { s, _ := v.(string); n, _ := strconv.ParseInt(s, 10, 64); return n }
	st.Through, st.Next, st.Numbered = num(h[0]), num(h[1]), num(h[2])
	st.State, _ = h[3].(string)
	// Numbers are checked against qnum: one principal per number.
	nums, err := b.rdb.HGetAll(b.ctx, base+"qnum:"+id).Result()
	require.NoError(t, err)
	for n, p := range nums {
		require.Equal(t, n, strconv.FormatInt(st.Numbers[p], 10), "qnum says %s has %s", p, n)
	}
	for p, n := range st.Numbers {
		if n > 0 {
			require.Equal(t, p, nums[strconv.FormatInt(n, 10)], "qwho says %s has %d", p, n)
		}
	}
	return st
}

// requireLedgerAgrees checks the ledger against Redis row by row: one
// ticket per principal with Redis' number, each pass issued with its expiry
// and state, the admitted number, and no pass for a number not admitted.
func (b *bundle) requireLedgerAgrees(t testing.TB, r queue.Ref, st queueState) []db.QueueTicket {
	t.Helper()
	tickets, err := b.engine.Ledger().Queues().QueueTickets(b.ctx, r.String())
	require.NoError(t, err)
	require.Len(t, tickets, len(st.Numbers), "one ledger row per ticket in Redis")
	for _, tk := range tickets {
		n, ok := st.Numbers[tk.Principal]
		require.True(t, ok, "%s is in the ledger, not in Redis", tk.Principal)
		require.Equal(t, n, tk.Number, "%s's number", tk.Principal)
		raw := st.Passes[tk.Principal]
		if raw == "" {
			require.Empty(t, tk.Pass, "%s has a pass in the ledger only", tk.Principal)
			continue
		}
		parts := strings.Split(raw, "|")
		require.Len(t, parts, 4)
		require.Equal(t, parts[0], tk.Pass, "%s's pass", tk.Principal)
		require.NotNil(t, tk.PassExpiresAt)
		require.Equal(t, parts[1], strconv.FormatInt(tk.PassExpiresAt.UnixMilli(), 10), "%s's pass expiry", tk.Principal)
		require.Equal(t, parts[2] == "U", tk.SpentAt != nil, "%s's pass spent", tk.Principal)
		require.Equal(t, parts[3], strconv.FormatInt(tk.Number, 10))
		require.LessOrEqual(t, tk.Number, st.Through, "a pass only for an admitted number")
	}
	var through int64
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT admitted_through FROM queues WHERE id = $1`, r.String()).Scan(&through))
	require.Equal(t, st.Through, through, "admitted through")
	return tickets
}

// open moves a queue's opening to now, in the ledger and in Redis (the
// scripts read Redis' clock, which a test cannot move).
func (b *bundle) open(t testing.TB, r queue.Ref) {
	t.Helper()
	_, err := b.pool.Exec(b.ctx, `UPDATE queues SET opens_at = now() - interval '1 second' WHERE id = $1`, r.String())
	require.NoError(t, err)
	base := b.engine.Keys().Base(r.Partition())
	require.NoError(t, b.rdb.HSet(b.ctx, base+"q:"+r.String(), "opens", time.Now().Add(-time.Second).UnixMilli()).Err())
}

// admit runs steps until through reaches at least want (the rate's credit
// comes with time), at most for a few seconds.
func (b *bundle) admit(t testing.TB, r queue.Ref, want int64) queue.StepResult {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		res := b.step(t, r)
		if res.Through >= want || time.Now().After(deadline) {
			return res
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (b *bundle) passOf(t testing.TB, r queue.Ref, who string) string {
	t.Helper()
	tk, ok, err := b.queues.MyTicket(b.ctx, who, r)
	require.NoError(t, err)
	require.True(t, ok, "%s has a ticket", who)
	return tk.Pass
}

// TestQueueIsInTheLedger: joins (before and after the opening), the
// opening's numbering, admissions and spent passes reach the ledger by the
// write-behind, and the ledger agrees with Redis row by row; applying the
// same events again changes nothing.
func TestQueueIsInTheLedger(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		b := setup(t, backend)
		r := b.queuedProduct(t, "Q-LEDGER", 4, inventory.QueueSettings{OpensAt: time.Now().Add(time.Hour), AdmitPerMinute: 600_000})
		for i := range 5 {
			tk, err := b.queues.Join(b.ctx, buyer(i).ID, r, queue.JoinInput{})
			require.NoError(t, err)
			require.Zero(t, tk.Number)
		}
		require.Equal(t, map[string]int{db.KindQueueJoin: 5}, b.drain(t))
		tickets, err := b.engine.Ledger().Queues().QueueTickets(b.ctx, r.String())
		require.NoError(t, err)
		require.Len(t, tickets, 5)
		for _, tk := range tickets {
			require.True(t, tk.PreQueue)
			require.Zero(t, tk.Number)
		}

		b.open(t, r)
		res := b.admit(t, r, 4)
		require.Equal(t, int64(4), res.Through, "four units, four passes")
		for i := 5; i < 7; i++ {
			tk, err := b.queues.Join(b.ctx, buyer(i).ID, r, queue.JoinInput{})
			require.NoError(t, err)
			require.Equal(t, int64(i+1), tk.Number)
		}
		st := b.queueState(t, r)
		byNumber := map[int64]string{}
		for p, n := range st.Numbers {
			byNumber[n] = p
		}
		// The holders of numbers 1 and 2 buy with their passes: a reserve,
		// and a cart.
		_, err = b.engine.Reserve(b.ctx, inventory.Principal{ID: byNumber[1]}, inventory.ReserveRequest{SKU: r.ID, Quantity: 1,
			AdmissionPass: b.passOf(t, r, byNumber[1])})
		require.NoError(t, err)
		cart, err := b.engine.Carts().ReserveCart(b.ctx, inventory.Principal{ID: byNumber[2]}, inventory.CartRequest{
			Lines: []inventory.CartLine{{SKU: r.ID, Quantity: 1}}, AdmissionPass: b.passOf(t, r, byNumber[2])})
		require.NoError(t, err)

		kinds := b.drain(t)
		require.Equal(t, 2, kinds[db.KindQueueJoin])
		require.Equal(t, 1, kinds[db.KindQueueClose])
		require.Equal(t, 1, kinds[db.KindQueueNumber], "five numbers, one batch")
		require.Equal(t, 1, kinds[db.KindQueueAdmit])
		require.Equal(t, 2, kinds[db.KindQueueSpend])
		st = b.queueState(t, r)
		tickets = b.requireLedgerAgrees(t, r, st)
		spent := map[string]string{}
		for _, tk := range tickets {
			if tk.SpentAt != nil {
				spent[tk.Principal] = tk.SpentFor
			}
			require.Equal(t, tk.Number <= 5, tk.PreQueue, "%s", tk.Principal)
		}
		require.Equal(t, map[string]string{byNumber[1]: spent[byNumber[1]], byNumber[2]: cart.Lines[0].Token}, spent)
		require.NotEmpty(t, spent[byNumber[1]], "the spending names the hold it bought")
		var pre int64
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT pre_queue_size FROM queues WHERE id = $1`, r.String()).Scan(&pre))
		require.Equal(t, int64(5), pre)

		// The ledger's numbering is the one anyone recomputes from the seed.
		q, err := b.queues.Settings(b.ctx, r)
		require.NoError(t, err)
		members := make([]string, 5)
		for i := range members {
			members[i] = buyer(i).ID
		}
		for i, who := range queue.PreQueueOrder(q.Seed, members) {
			require.Equal(t, int64(i+1), tickets[i].Number)
			require.Equal(t, who, tickets[i].Principal)
		}

		// Every movement once; a batch applied again is a no-op.
		var moves int
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM queue_movements WHERE queue_id = $1`, r.String()).Scan(&moves))
		require.Equal(t, 5+2+1+1+1+2, moves)
		require.NoError(t, b.engine.Ledger().ApplyEvents(b.ctx, nil, []db.Event{{
			ID: "qadmit:" + r.String() + ":replayed", Kind: db.KindQueueAdmit, Queue: r.String(), First: 1, Last: 4,
			Nonce: "another", ExpiresAt: time.Now().Add(time.Hour), At: time.Now(),
		}}))
		b.requireLedgerAgrees(t, r, st) // the passes are the first admission's
	})
}

func (b *bundle) wipe(t testing.TB) {
	t.Helper()
	del := func(ctx context.Context, c *redis.Client) error {
		return wipeScript.Eval(ctx, c, nil, b.prefix+"*").Err()
	}
	switch c := b.rdb.(type) {
	case *redis.ClusterClient:
		require.NoError(t, c.ForEachMaster(b.ctx, del))
	case *redis.Client:
		require.NoError(t, del(b.ctx, c))
	}
}

// wipeScript deletes the keys of a prefix in one script, like a FLUSHALL of
// this test's keys only (on a cluster, on each master).
var wipeScript = redis.NewScript(`#!lua flags=allow-cross-slot-keys
for _, k in ipairs(redis.call('KEYS', ARGV[1])) do
  redis.call('DEL', k)
end
return 0`)

// TestQueueRebuiltAfterRedisLoss: a queue with tickets from before and after
// its opening, some admitted, some passes spent, is lost with Redis; the
// rebuild from the ledger gives back every number, position, the admitted
// set and every pass in its state, and the admission goes on from there.
// Then Redis is lost again and the first request is a reserve: the SKU's
// rebuild restores the queue before the SKU is live, so the pass is there.
func TestQueueRebuiltAfterRedisLoss(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		b := setup(t, backend)
		const pre, after, units, bought = 200, 100, 60, 25
		r := b.queuedProduct(t, "Q-LOST", units, inventory.QueueSettings{OpensAt: time.Now().Add(time.Hour), AdmitPerMinute: 600_000})
		for i := range pre {
			_, err := b.queues.Join(b.ctx, buyer(i).ID, r, queue.JoinInput{})
			require.NoError(t, err)
		}
		b.open(t, r)
		for i := pre; i < pre+after; i++ {
			_, err := b.queues.Join(b.ctx, buyer(i).ID, r, queue.JoinInput{})
			require.NoError(t, err)
		}
		res := b.admit(t, r, units)
		require.Equal(t, int64(units), res.Through)
		st := b.queueState(t, r)
		byNumber := map[int64]string{}
		for p, n := range st.Numbers {
			byNumber[n] = p
		}
		for n := int64(1); n <= bought; n++ {
			who := byNumber[n]
			_, err := b.engine.Reserve(b.ctx, inventory.Principal{ID: who}, inventory.ReserveRequest{SKU: r.ID, Quantity: 1,
				AdmissionPass: b.passOf(t, r, who)})
			require.NoError(t, err)
		}
		positions := map[string]queue.Ticket{}
		for i := range pre + after {
			tk, ok, err := b.queues.MyTicket(b.ctx, buyer(i).ID, r)
			require.NoError(t, err)
			require.True(t, ok)
			positions[buyer(i).ID] = tk
		}
		b.drain(t)
		before := b.queueState(t, r)
		b.requireLedgerAgrees(t, r, before)
		require.Len(t, before.Live, units-bought)

		b.wipe(t)
		for i := range pre + after {
			tk, ok, err := b.queues.MyTicket(b.ctx, buyer(i).ID, r)
			require.NoError(t, err)
			require.True(t, ok, "%s's ticket is back", buyer(i).ID)
			require.Equal(t, positions[buyer(i).ID], tk, "%s's ticket, position and pass", buyer(i).ID)
		}
		after1 := b.queueState(t, r)
		require.Equal(t, before.Numbers, after1.Numbers)
		require.Equal(t, before.Passes, after1.Passes)
		require.Equal(t, before.Through, after1.Through)
		require.Equal(t, before.Next, after1.Next)
		require.Equal(t, "open", after1.State)
		require.ElementsMatch(t, before.Live, after1.Live, "the unspent passes count against the stock again")
		tickets, took := b.queues.RestoreStats()
		require.EqualValues(t, pre+after, tickets)
		t.Logf("restored %d tickets in %s", tickets, took)

		// A spent pass stays spent; an unspent one buys; the admission goes on
		// from the number it had reached: no unit is promised twice.
		_, err := b.engine.Reserve(b.ctx, inventory.Principal{ID: byNumber[1]}, inventory.ReserveRequest{SKU: r.ID, Quantity: 1,
			AdmissionPass: positions[byNumber[1]].Pass})
		require.ErrorIs(t, err, inventory.ErrQueueRequired, "the ticket is USED: it shows no pass")
		_, err = b.engine.Reserve(b.ctx, inventory.Principal{ID: byNumber[1]}, inventory.ReserveRequest{SKU: r.ID, Quantity: 1,
			AdmissionPass: strings.Split(before.Passes[byNumber[1]], "|")[0]})
		require.ErrorIs(t, err, inventory.ErrPassInvalid, "a spent pass buys nothing after the rebuild")
		who := byNumber[bought+1]
		_, err = b.engine.Reserve(b.ctx, inventory.Principal{ID: who}, inventory.ReserveRequest{SKU: r.ID, Quantity: 1,
			AdmissionPass: positions[who].Pass})
		require.NoError(t, err)
		res = b.step(t, r)
		require.Equal(t, int64(units), res.Through, "every unit is held or promised: nobody more is admitted")
		require.Equal(t, queue.StatusOpen, res.Status)

		// Lost again, before the last purchase reached the ledger: the first
		// request after is a reserve with a pass.
		b.drain(t)
		b.wipe(t)
		who = byNumber[bought+2]
		h, err := b.engine.Reserve(b.ctx, inventory.Principal{ID: who}, inventory.ReserveRequest{SKU: r.ID, Quantity: 1,
			AdmissionPass: positions[who].Pass})
		require.NoError(t, err, "the SKU's rebuild restored the queue first")
		require.Equal(t, inventory.StatusHeld, h.Status)
		b.drain(t)
		final := b.queueState(t, r)
		b.requireLedgerAgrees(t, r, final)
		require.Len(t, final.Live, units-bought-2)
		s, err := b.engine.Catalog().Stock(b.ctx, r.ID)
		require.NoError(t, err)
		require.Equal(t, bought+2, s.Held)
		require.Equal(t, units-bought-2, s.Available)
		t.Logf("%s: %d tickets restored twice, %d holds kept", backend, pre+after, bought+2)
	})
}
