package inventory

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/internal/testenv"
	"github.com/dropline/dropline/inventory/script"
)

// One run of reserve.lua decides its requests in turn, each against the
// writes of those before it: the batch gives exactly the answers the same
// requests would get one after the other, and announces the SKU once.
func TestReserveBatchDecidesInTurn(t *testing.T) {
	t.Parallel()
	e, r := engineWithProduct(t, ProductInput{SKU: "BATCH", Name: "b", Price: Money{1, "EUR"}, Stock: 2, MaxPerUser: 1})
	ctx := context.Background()

	p := PartitionOf("BATCH")
	sub := r.Client.SSubscribe(ctx, e.keys.Channel("BATCH"))
	defer func() { _ = sub.Close() }()
	_, err := sub.Receive(ctx)
	require.NoError(t, err)

	buyers := []string{"alice", "alice", "bob", "carol", "dave"}
	calls := make([]*reserveCall, len(buyers))
	for i, who := range buyers {
		calls[i] = plainReserveCall(e, p, "BATCH", who, 1)
	}
	seqBefore, err := r.Client.HGet(ctx, e.keys.SKU("BATCH"), "seq").Int64()
	require.NoError(t, err)
	raw, err := e.run(ctx, e.reserveScript(p, calls))
	require.NoError(t, err)
	res, err := script.ReserveRepliesOf(raw, len(buyers))
	require.NoError(t, err)
	seqAfter, err := r.Client.HGet(ctx, e.keys.SKU("BATCH"), "seq").Int64()
	require.NoError(t, err)
	require.Equal(t, seqBefore+2, seqAfter, "each hold moves the stock's sequence by one")
	var got []string
	for _, x := range res {
		got = append(got, x.Code)
	}
	require.Equal(t, []string{"HELD", "QUOTA_EXCEEDED", "HELD", "OUT_OF_STOCK", "OUT_OF_STOCK"}, got)
	require.Equal(t, &OutOfStockError{Available: 0}, rejectionError(res[3].Rejection))

	s, err := e.Catalog().Stock(ctx, "BATCH")
	require.NoError(t, err)
	require.Equal(t, 0, s.Available)
	require.Equal(t, 2, s.Held)
	n, err := r.Client.XLen(ctx, e.keys.Outbox(p)).Result()
	require.NoError(t, err)
	require.EqualValues(t, 2, n, "one event per hold")

	msg, err := sub.ReceiveMessage(ctx)
	require.NoError(t, err)
	require.Contains(t, msg.Payload, `"available":0`, "the one announcement says what the batch left")
	require.Contains(t, msg.Payload, `"held":2`)
}

// Concurrent reserves of one partition share runs of reserve.lua, and every
// caller gets its own answer: as many holds as units, the rest out of stock.
func TestConcurrentReservesShareBatches(t *testing.T) {
	t.Parallel()
	const units, callers = 40, 200
	e, _ := engineWithProduct(t, ProductInput{SKU: "SHARED", Name: "s", Price: Money{1, "EUR"}, Stock: units})
	ctx := context.Background()

	errs := make([]error, callers)
	tokens := make([]string, callers)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := 0; i < callers; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			<-start
			h, err := e.Reserve(ctx, Principal{ID: "buyer-" + string(rune('a'+i%26)) + string(rune('a'+i/26))}, ReserveRequest{SKU: "SHARED", Quantity: 1})
			errs[i], tokens[i] = err, h.Token
		}(i)
	}
	close(start)
	wg.Wait()
	held, seen := 0, map[string]bool{}
	for i, err := range errs {
		if err == nil {
			held++
			require.False(t, seen[tokens[i]], "a token answered twice")
			seen[tokens[i]] = true
			continue
		}
		var oos *OutOfStockError
		require.ErrorAs(t, err, &oos)
	}
	require.Equal(t, units, held)
	s, err := e.Catalog().Stock(ctx, "SHARED")
	require.NoError(t, err)
	require.Equal(t, 0, s.Available)
	require.Equal(t, units, s.Held)

	var batched, runs float64
	m := &dto.Metric{}
	require.NoError(t, e.metrics.reserveBatch.Write(m))
	batched, runs = m.GetHistogram().GetSampleSum(), float64(m.GetHistogram().GetSampleCount())
	require.EqualValues(t, callers, batched, "every reserve went through a batch")
	require.Less(t, runs, float64(callers), "some reserves shared a run of the script")
}

// A reserve whose caller stopped waiting before its batch left is not sent:
// nobody would learn of the hold, and its units would stay held until it
// expired.
func TestReserveWhoseCallerLeftBeforeItsBatchIsNotSent(t *testing.T) {
	t.Parallel()
	e, _ := engineWithProduct(t, ProductInput{SKU: "LEFT", Name: "l", Price: Money{1, "EUR"}, Stock: 3})
	ctx := context.Background()

	// The partition's batches are all on their way (as the test says), so
	// the reserve waits in the queue; its caller gives up meanwhile.
	p := PartitionOf("LEFT")
	q := &reserveQueue{inFlight: reserveBatchesInFlight}
	e.batches.mu.Lock()
	e.batches.parts = map[int]*reserveQueue{p: q}
	e.batches.mu.Unlock()
	call := plainReserveCall(e, p, "LEFT", "alice", 1)
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	_, err := e.reserveInBatch(cctx, p, call)
	require.ErrorIs(t, err, context.Canceled)

	// A batch on its way ends and takes the queue.
	e.drainReserves(ctx, p, q)
	s, err := e.Catalog().Stock(ctx, "LEFT")
	require.NoError(t, err)
	require.Equal(t, 0, s.Held, "a hold was made for a caller that had left")
	require.Equal(t, 3, s.Available)
	require.Equal(t, reserveBatchesInFlight-1, q.inFlight)
}

// An error while deciding one request of a batch fails that request alone:
// the requests before it made their holds, and their callers hear of them.
func TestReserveBatchErrorFailsItsRequestAlone(t *testing.T) {
	t.Parallel()
	e, r := engineWithProduct(t, ProductInput{SKU: "GOOD", Name: "g", Price: Money{1, "EUR"}, Stock: 3})
	ctx := context.Background()

	// The second request's stock hash is broken: it has a generation but no
	// counters, so deciding it raises an error in the script.
	p := PartitionOf("GOOD")
	require.NoError(t, r.Client.HSet(ctx, e.keys.Base(p)+"sku:BROKEN", "gen", "1").Err())
	calls := []*reserveCall{plainReserveCall(e, p, "GOOD", "alice", 1), plainReserveCall(e, p, "BROKEN", "bob", 1)}
	for _, c := range calls {
		c.done = make(chan struct{})
	}
	e.runReserveBatch(ctx, p, calls)
	require.NoError(t, calls[0].err, "the request before the broken one")
	require.Equal(t, codeHeld, replyCode(calls[0].res.Code))
	require.ErrorIs(t, calls[1].err, ErrUnavailable)
	s, err := e.Catalog().Stock(ctx, "GOOD")
	require.NoError(t, err)
	require.Equal(t, 1, s.Held)
}

// A batch deducts on its copy of the SKU's counters and writes them once,
// except where the sequence is past what a Lua number holds exactly: from
// there each hold moves the hash in Redis. A batch that crosses that line
// leaves the counters and the sequence exact, and announces them.
func TestReserveBatchCrossingTheExactSequence(t *testing.T) {
	t.Parallel()
	e, r := engineWithProduct(t, ProductInput{SKU: "SEQ", Name: "s", Price: Money{1, "EUR"}, Stock: 5})
	ctx := context.Background()

	codes, sub := reserveBatchAtSequence(t, e, r, "SEQ", "9007199254740990", "alice", "bob", "carol", "dave")
	for _, c := range codes {
		require.Equal(t, string(codeHeld), c)
	}
	h, err := r.Client.HMGet(ctx, e.keys.SKU("SEQ"), "avail", "held", "seq").Result()
	require.NoError(t, err)
	require.Equal(t, []any{"1", "4", "9007199254740994"}, h)

	msg, err := sub.ReceiveMessage(ctx)
	require.NoError(t, err)
	require.Contains(t, msg.Payload, `"available":1,"held":4,"sold":0,"seq":9007199254740994`)
}

// A request refused after the sequence has crossed what a Lua number holds
// exactly reads the SKU's hash again: the one announcement of the batch
// still carries the sequence the hash has, digit for digit.
func TestReserveBatchRefusedPastTheExactSequenceAnnouncesItExactly(t *testing.T) {
	t.Parallel()
	e, r := engineWithProduct(t, ProductInput{SKU: "SEQ2", Name: "s", Price: Money{1, "EUR"}, Stock: 2})
	ctx := context.Background()

	// Two holds take the sequence to 2^53+1; the third finds no stock.
	codes, sub := reserveBatchAtSequence(t, e, r, "SEQ2", "9007199254740991", "alice", "bob", "carol")
	require.Equal(t, []string{"HELD", "HELD", "OUT_OF_STOCK"}, codes)
	h, err := r.Client.HMGet(ctx, e.keys.SKU("SEQ2"), "avail", "held", "seq").Result()
	require.NoError(t, err)
	require.Equal(t, []any{"0", "2", "9007199254740993"}, h)

	msg, err := sub.ReceiveMessage(ctx)
	require.NoError(t, err)
	require.Contains(t, msg.Payload, `"available":0,"held":2,"sold":0,"seq":9007199254740993,`)
}

// reserveBatchAtSequence sets sku's sequence to seq, subscribes to its
// announcements, and runs one batch of one unit for each buyer, in order:
// the answers' codes, and the subscription (closed with the test).
func reserveBatchAtSequence(t *testing.T, e *Engine, r testenv.RedisEnv, sku, seq string, buyers ...string) ([]string, *redis.PubSub) {
	t.Helper()
	ctx := context.Background()
	p := PartitionOf(sku)
	require.NoError(t, r.Client.HSet(ctx, e.keys.SKU(sku), "seq", seq).Err())
	sub := r.Client.SSubscribe(ctx, e.keys.Channel(sku))
	t.Cleanup(func() { _ = sub.Close() })
	_, err := sub.Receive(ctx)
	require.NoError(t, err)
	calls := make([]*reserveCall, len(buyers))
	for i, who := range buyers {
		calls[i] = plainReserveCall(e, p, sku, who, 1)
	}
	raw, err := e.run(ctx, e.reserveScript(p, calls))
	require.NoError(t, err)
	res, err := script.ReserveRepliesOf(raw, len(calls))
	require.NoError(t, err)
	codes := make([]string, len(res))
	for i, x := range res {
		codes[i] = x.Code
	}
	return codes, sub
}

// A batch of requests for two SKUs of one partition, interleaved, decides
// and leaves what the same requests leave run one at a time: each SKU's
// counters, sequence and quota hash, and every answer.
func TestReserveBatchOfTwoSKUsIsItsRequestsInTurn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e, r := engineWithProduct(t, ProductInput{SKU: "MIX-0", Name: "m", Price: Money{1, "EUR"}, Stock: 3, MaxPerUser: 2})
	p := PartitionOf("MIX-0")
	// Four SKUs of partition p: a pair reserved in one batch, a pair one
	// request at a time.
	skus := []string{"MIX-0"}
	for i := 1; len(skus) < 4; i++ {
		if sku := fmt.Sprintf("MIX-%d", i); PartitionOf(sku) == p {
			skus = append(skus, sku)
		}
	}
	admin := Principal{ID: "admin", Admin: true}
	for i, sku := range skus[1:] {
		in := ProductInput{SKU: sku, Name: "m", Price: Money{1, "EUR"}, Stock: 2}
		if i == 1 { // the other pair's first SKU
			in.Stock, in.MaxPerUser = 3, 2
		}
		_, err := e.Catalog().CreateProduct(ctx, admin, in)
		require.NoError(t, err)
	}
	type req struct {
		sku int // 0 or 1: the pair's first or second SKU
		who string
		qty int
	}
	reqs := []req{{0, "alice", 1}, {1, "bob", 1}, {0, "alice", 1}, {0, "alice", 1}, {1, "carol", 1},
		{1, "dave", 1}, {0, "erin", 2}, {0, "frank", 1}, {1, "bob", 1}}
	codes := func(res []script.ReserveReply) []string {
		var out []string
		for _, x := range res {
			if x.Code == "HELD" {
				out = append(out, x.Code)
				continue
			}
			r := x.Rejection
			out = append(out, fmt.Sprintf("%s [%s %s %d]", x.Code, r.A, r.B, map[bool]int{false: 0, true: 1}[r.Replayed]))
		}
		return out
	}
	state := func(sku string) []any {
		h, err := r.Client.HMGet(ctx, e.keys.SKU(sku), "avail", "held", "sold", "seq").Result()
		require.NoError(t, err)
		q, err := r.Client.HGetAll(ctx, e.keys.Quota(sku)).Result()
		require.NoError(t, err)
		seq, err := strconv.ParseInt(h[3].(string), 10, 64)
		require.NoError(t, err)
		return []any{h[0], h[1], h[2], seq, q}
	}
	before := [][]any{state(skus[0]), state(skus[1]), state(skus[2]), state(skus[3])}

	var batch []*reserveCall
	for _, r := range reqs {
		batch = append(batch, plainReserveCall(e, p, skus[r.sku], r.who, r.qty))
	}
	raw, err := e.run(ctx, e.reserveScript(p, batch))
	require.NoError(t, err)
	batched, err := script.ReserveRepliesOf(raw, len(batch))
	require.NoError(t, err)

	var single []script.ReserveReply
	for _, r := range reqs {
		raw, err := e.run(ctx, e.reserveScript(p, []*reserveCall{plainReserveCall(e, p, skus[2+r.sku], r.who, r.qty)}))
		require.NoError(t, err)
		res, err := script.ReserveRepliesOf(raw, 1)
		require.NoError(t, err)
		single = append(single, res[0])
	}
	// The replies of holds carry Redis' clock; only their codes are compared.
	strip := func(c []string) []string {
		for i, s := range c {
			if strings.HasPrefix(s, "HELD") {
				c[i] = "HELD"
			}
		}
		return c
	}
	require.Equal(t, strip(codes(single)), strip(codes(batched)))
	require.Equal(t, []string{"HELD", "HELD", "HELD", "QUOTA_EXCEEDED [2 2 0]", "HELD", "OUT_OF_STOCK [0 0 0]",
		"OUT_OF_STOCK [1 0 0]", "HELD", "OUT_OF_STOCK [0 0 0]"}, strip(codes(batched)))
	for i := 0; i < 2; i++ {
		b, s := state(skus[i]), state(skus[2+i])
		require.Equal(t, b[:3], s[:3], "counters of SKU %d", i)
		require.Equal(t, b[3].(int64)-before[i][3].(int64), s[3].(int64)-before[2+i][3].(int64), "sequence of SKU %d", i)
		require.Equal(t, b[4], s[4], "quota of SKU %d", i)
	}
}

// reserve.lua checks each distinct quantity and duration text once a run and
// keeps the answer for the requests after: a text it refused is refused
// again, one it took is taken again, and a quantity written with a leading
// zero is recorded as its number, whatever the requests around it asked.
func TestReserveBatchChecksEachRequestsNumbers(t *testing.T) {
	t.Parallel()
	e, r := engineWithProduct(t, ProductInput{SKU: "NUMS", Name: "n", Price: Money{1, "EUR"}, Stock: 20})
	ctx := context.Background()
	p := PartitionOf("NUMS")
	type req struct{ qty, holdMs, want string }
	reqs := []req{
		{"2", "60000", "HELD"}, {"x", "60000", "INVALID_INPUT quantity"}, {"02", "60000", "HELD"},
		{"2", "999", "INVALID_INPUT holdSeconds"}, {"x", "60000", "INVALID_INPUT quantity"}, {"0", "60000", "INVALID_INPUT quantity"},
		{"2", "60000", "HELD"}, {"02", "999", "INVALID_INPUT holdSeconds"}, {"1e1", "60000", "INVALID_INPUT quantity"},
		{"3", "0x3e8", "INVALID_INPUT holdSeconds"}, {"3", "61000", "HELD"},
	}
	calls := make([]*reserveCall, len(reqs))
	for i := range reqs {
		calls[i] = plainReserveCall(e, p, "NUMS", fmt.Sprintf("buyer-%d", i), 1)
	}
	call := e.reserveScript(p, calls)
	// The requests' arguments follow the head's seven, the one SKU and no
	// budget, nine each.
	const first = 7 + 1
	for i, q := range reqs {
		call.Argv[first+9*i+2], call.Argv[first+9*i+3] = q.qty, q.holdMs
	}
	raw, err := e.run(ctx, call)
	require.NoError(t, err)
	res, err := script.ReserveRepliesOf(raw, len(calls))
	require.NoError(t, err)
	var got, want []string
	for i, rep := range res {
		code := rep.Code
		if code == "INVALID_INPUT" {
			code += " " + rep.Rejection.A
		}
		got, want = append(got, code), append(want, reqs[i].want)
	}
	require.Equal(t, want, got)
	for i, q := range reqs {
		if q.want != "HELD" {
			continue
		}
		h, err := r.Client.HMGet(ctx, e.keys.Hold(p, calls[i].token()), "qty").Result()
		require.NoError(t, err)
		require.Equal(t, strings.TrimLeft(q.qty, "0"), h[0], "request %d's recorded quantity", i)
	}
	s, err := e.Catalog().Stock(ctx, "NUMS")
	require.NoError(t, err)
	require.Equal(t, 2+2+2+3, s.Held)
}
