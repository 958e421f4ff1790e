package inventory_test

import (
	"context"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/internal/testenv"
	"github.com/dropline/dropline/inventory"
)

// lossyRedis is a client on backend's Redis whose every connection goes
// through a fault proxy (one per server): a test can make them lose the
// replies of chosen commands. The engine behind it runs on a key prefix and
// a database of its own.
func lossyRedis(t *testing.T, backend string) (*bundle, []*testenv.Proxy) {
	t.Helper()
	ctx := context.Background()
	env := testenv.RedisBackend(t, backend)
	proxies := map[string]*testenv.Proxy{}
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		if p, ok := proxies[addr]; ok {
			addr = p.Addr
		}
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}
	var client redis.UniversalClient
	switch c := env.Client.(type) {
	case *redis.Client:
		opts := *c.Options()
		proxies[opts.Addr] = testenv.NewProxy(t, opts.Addr)
		opts.Dialer = dial
		client = redis.NewClient(&opts)
	case *redis.ClusterClient:
		var mu sync.Mutex // ForEachMaster calls it concurrently
		require.NoError(t, c.ForEachMaster(ctx, func(_ context.Context, m *redis.Client) error {
			addr := m.Options().Addr
			p := testenv.NewProxy(t, addr)
			mu.Lock()
			defer mu.Unlock()
			proxies[addr] = p
			return nil
		}))
		opts := *c.Options()
		opts.Dialer = dial
		client = redis.NewClusterClient(&opts)
	}
	t.Cleanup(func() { _ = client.Close() })
	pool := testenv.Postgres(t)
	e, err := inventory.NewEngine(ctx, inventory.Config{KeyPrefix: env.Prefix}, client, pool, zerolog.Nop())
	require.NoError(t, err)
	var list []*testenv.Proxy
	for _, p := range proxies {
		list = append(list, p)
	}
	return &bundle{ctx: ctx, engine: e, rdb: client, pool: pool, prefix: env.Prefix}, list
}

// loseReply makes the proxies lose every reply to the next commands match
// picks (as many as left says), however often the client sends each again.
type loseReply struct {
	proxies []*testenv.Proxy
	match   func(args []any) bool
	left    atomic.Int32
	fired   atomic.Int32
}

func (*loseReply) DialHook(next redis.DialHook) redis.DialHook { return next }

func (*loseReply) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (l *loseReply) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if !l.match(cmd.Args()) || l.left.Add(-1) < 0 {
			return next(ctx, cmd)
		}
		l.fired.Add(1)
		for _, p := range l.proxies {
			p.LoseReplies(1000)
		}
		defer func() {
			for _, p := range l.proxies {
				p.LoseReplies(0)
			}
		}()
		return next(ctx, cmd) // the client's own retries included: each runs, none is answered
	}
}

// finishCartHeld matches finish_cart.lua recording a cart HELD: EVALSHA (or
// EVAL) sha 3 cart:<token> cartidem:<hash> cartpending <token> HELD ...
func finishCartHeld(args []any) bool {
	if len(args) < 8 {
		return false
	}
	name, _ := args[0].(string)
	cart, _ := args[3].(string)
	outcome, _ := args[7].(string)
	return (strings.EqualFold(name, "evalsha") || strings.EqualFold(name, "eval")) &&
		strings.Contains(cart, ":cart:") && outcome == "HELD"
}

// TestLostReplyOfAHeldCart loses every reply to finish_cart.lua recording a
// cart HELD (the script runs, its answer never arrives, also when the Redis
// client sends it again). The cart is held all the same: its caller must not
// let go of lines the cart is recorded as holding (it did, and a retry with
// the same key replayed a cart whose every line was cancelled), and the
// cart, its lines, the ledger and a retry with its key all agree.
func TestLostReplyOfAHeldCart(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		b, proxies := lossyRedis(t, backend)
		skus := skusInPartitions("LOSTFIN", 3)
		for _, sku := range skus {
			b.product(t, sku, 2, 0)
		}
		hook := &loseReply{proxies: proxies, match: finishCartHeld}
		b.rdb.AddHook(hook)
		hook.left.Store(1)
		alice := buyer(1)
		req := inventory.CartRequest{Lines: lines(skus, 1, 1, 1), IdempotencyKey: "checkout-lost-reply", HoldFor: time.Minute}
		cart, err := b.engine.Carts().ReserveCart(b.ctx, alice, req)
		require.EqualValues(t, 1, hook.fired.Load(), "the reply of finish_cart.lua was lost")
		var lost int64
		for _, p := range proxies {
			lost += p.Dropped.Load()
		}
		t.Logf("%s: %d replies of finish_cart.lua lost", backend, lost)
		require.Positive(t, lost)

		// The script ran: the cart is held, and so are its lines.
		require.NoError(t, err)
		require.Equal(t, inventory.StatusHeld, cart.Status)
		require.Len(t, cart.Lines, 3)
		for _, l := range cart.Lines {
			require.Equal(t, inventory.StatusHeld, l.Status, "line %s", l.SKU)
			require.Equal(t, "HELD", b.holdField(t, l.Token, "st"))
		}
		for _, sku := range skus {
			require.Equal(t, 1, b.requireBalanced(t, sku).Held, "%s", sku)
		}
		// A retry with the key replays that very cart, lines held.
		again, err := b.engine.Carts().ReserveCart(b.ctx, alice, req)
		require.NoError(t, err)
		require.True(t, again.Replayed)
		require.Equal(t, cart.Token, again.Token)
		require.Equal(t, inventory.StatusHeld, again.Status)
		for _, l := range again.Lines {
			require.Equal(t, inventory.StatusHeld, l.Status, "replayed line %s", l.SKU)
		}
		// The ledger has the lines held, and nothing let go.
		require.Equal(t, map[string]int{"reserve": 3}, b.drainOutbox(t))
		for _, l := range cart.Lines {
			require.Equal(t, 1, b.count(t, `SELECT count(*) FROM reservations WHERE token = $1 AND status = 'HELD'`, l.Token))
		}
		sold, err := b.engine.Carts().CommitCart(b.ctx, alice, cart.Token)
		require.NoError(t, err)
		require.Equal(t, inventory.StatusCommitted, sold.Status)
		for _, sku := range skus {
			require.Equal(t, 1, b.requireBalanced(t, sku).Sold)
		}

		// Lost again when the caller asks how the cart stands: the answer
		// is UNAVAILABLE, and the lines stay with the cart, which is HELD.
		hook.left.Store(2)
		req.IdempotencyKey = "checkout-lost-twice"
		_, err = b.engine.Carts().ReserveCart(b.ctx, alice, req)
		require.EqualValues(t, 3, hook.fired.Load())
		require.ErrorIs(t, err, inventory.ErrUnavailable)
		for _, sku := range skus {
			require.Equal(t, 1, b.requireBalanced(t, sku).Held, "%s: the cart keeps its line", sku)
		}
		again, err = b.engine.Carts().ReserveCart(b.ctx, alice, req)
		require.NoError(t, err)
		require.True(t, again.Replayed)
		require.Equal(t, inventory.StatusHeld, again.Status)
		for _, l := range again.Lines {
			require.Equal(t, inventory.StatusHeld, l.Status, "replayed line %s", l.SKU)
		}
		require.Zero(t, b.drainOutbox(t)["cancel"], "no line was let go")
	})
}
