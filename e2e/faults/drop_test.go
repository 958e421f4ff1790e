package faults

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

const (
	reserveMutation = `mutation($input: ReserveInput!) {
  reserve(input: $input) { reservation { token status quantity expiresAt } userErrors { code message } } }`
	commitMutation = `mutation($token: ID!) {
  commit(input: {token: $token}) { reservation { token status quantity } userErrors { code message } } }`
	cancelMutation = `mutation($token: ID!) {
  cancel(input: {token: $token}) { reservation { token status quantity } userErrors { code message } } }`
)

// dropConfig shapes one drop: Buyers buyers, Concurrency at a time, each
// reserving 1..MaxQty units with an idempotency key, then committing,
// cancelling or abandoning the hold.
type dropConfig struct {
	SKU         string
	Total       int
	Buyers      int
	Concurrency int
	MaxQty      int
	HoldSeconds int
	// Commit and Cancel are the shares of holders who commit or cancel;
	// the others abandon their hold to expiry.
	Commit, Cancel float64
	// DoubleCommit is the share of committers who send two commits at once.
	DoubleCommit float64
	// Within bounds the whole drop.
	Within time.Duration
	// Pace spaces buyers out, so a fault lands mid-drop.
	Pace time.Duration
	// Gate, when set, holds back the buyers from the GateAt-th on until it
	// is closed: what the test does in between happens mid-drop however
	// slowly it runs.
	Gate   <-chan struct{}
	GateAt int
	// Think is the most a holder waits before committing or cancelling
	// (a checkout's latency), so holds are live when a fault lands.
	Think time.Duration
	// Record keeps the clients' operations for the linearizability check.
	Record bool
	// Client, when set, is the buyers' HTTP client (e.g. one whose
	// connections leave from many loopback addresses).
	Client *http.Client
}

func (c *dropConfig) defaults() {
	if c.Total == 0 {
		c.Total = 60
	}
	switch {
	case c.Buyers == 0:
		c.Buyers = 150
	case c.Buyers < 0: // the test drives its own clients
		c.Buyers = 0
	}
	if c.Concurrency == 0 {
		c.Concurrency = 24
	}
	if c.MaxQty == 0 {
		c.MaxQty = 2
	}
	if c.HoldSeconds == 0 {
		c.HoldSeconds = 3
	}
	if c.Commit == 0 && c.Cancel == 0 {
		c.Commit, c.Cancel = 0.6, 0.2
	}
	if c.Think == 0 {
		c.Think = 800 * time.Millisecond
	}
	if c.Within == 0 {
		c.Within = 40 * time.Second
	}
}

type holdInfo struct {
	Buyer string
	Qty   int
}

// drop is a running drop and everything its clients were told.
type drop struct {
	cfg dropConfig
	s   *system
	rec *recorder // optional: per-SKU history for the linearizability check

	mu        sync.Mutex
	holds     map[string]holdInfo // token -> holder, for every reserve acknowledged
	committed map[string]bool     // commits acknowledged
	cancelled map[string]bool     // cancels acknowledged
	refused   map[string]string   // commit or cancel answered with a business refusal
	internals []string            // top-level errors seen (kept to a few)
	samples   []string            // Redis invariant violations seen by the sampler

	Requests   atomic.Int64 // HTTP requests sent
	Retries    atomic.Int64 // requests repeated after a transport error or UNAVAILABLE
	Internal   atomic.Int64 // top-level errors (INTERNAL and others)
	Finished   atomic.Int64 // buyers done
	Unresolved atomic.Int64 // operations still undecided at the deadline
	Samples    atomic.Int64 // Redis samples taken

	// served counts the decided answers by instance and mutation
	// ("old/reserve"), as the instances' names say.
	served map[string]int

	done chan struct{}
	stop chan struct{}
}

// startDrop creates the product (on the first live process) and releases
// the buyers; wait returns when they are all done.
func startDrop(s *system, cfg dropConfig) *drop {
	s.t.Helper()
	cfg.defaults()
	s.createProduct(s.live()[0], cfg.SKU, cfg.Total, 0)
	d := &drop{
		cfg: cfg, s: s,
		holds: map[string]holdInfo{}, committed: map[string]bool{}, cancelled: map[string]bool{}, refused: map[string]string{},
		served: map[string]int{}, done: make(chan struct{}), stop: make(chan struct{}),
	}
	if cfg.Record {
		d.rec = &recorder{}
	}
	go d.run()
	return d
}

func (d *drop) run() {
	defer close(d.done)
	ctx, cancel := context.WithTimeout(context.Background(), d.cfg.Within)
	defer cancel()
	var sampler sync.WaitGroup
	sampler.Add(1)
	go func() { defer sampler.Done(); d.sample(ctx) }()
	client := d.cfg.Client
	if client == nil {
		client = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	}
	sem := make(chan struct{}, d.cfg.Concurrency)
	var wg sync.WaitGroup
	for i := 0; i < d.cfg.Buyers; i++ {
		if d.cfg.Gate != nil && i == d.cfg.GateAt {
			select {
			case <-d.cfg.Gate:
			case <-ctx.Done():
			}
		}
		if ctx.Err() != nil {
			break
		}
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done(); d.Finished.Add(1) }()
			d.buyer(ctx, client, i)
		}()
		if d.cfg.Pace > 0 {
			time.Sleep(d.cfg.Pace)
		}
	}
	wg.Wait()
	close(d.stop)
	sampler.Wait()
	client.CloseIdleConnections()
}

// wait blocks until every buyer is done.
func (d *drop) wait(t *testing.T) {
	t.Helper()
	select {
	case <-d.done:
	case <-time.After(d.cfg.Within + 30*time.Second):
		t.Fatalf("drop %s did not finish", d.cfg.SKU)
	}
}

// waitProgress blocks until n buyers are done (or the drop is).
func (d *drop) waitProgress(t *testing.T, n int) {
	t.Helper()
	deadline := time.Now().Add(d.cfg.Within)
	for d.Finished.Load() < int64(n) && time.Now().Before(deadline) {
		select {
		case <-d.done:
			return
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// sample reads the SKU's counters straight from Redis every 20 ms: held +
// sold never exceed total, and no counter is negative, at any instant.
func (d *drop) sample(ctx context.Context) {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-d.stop:
			return
		case <-tick.C:
		}
		sctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		st, ok := d.s.redisStock(sctx, d.cfg.SKU)
		cancel()
		if !ok {
			continue
		}
		d.Samples.Add(1)
		if st.Held+st.Sold > st.Total || st.Available < 0 || st.Held < 0 || st.Available+st.Held+st.Sold != st.Total {
			d.mu.Lock()
			if len(d.samples) < 10 {
				d.samples = append(d.samples, fmt.Sprintf("%+v", st))
			}
			d.mu.Unlock()
		}
	}
}

// outcome is a mutation's final answer after retries.
type outcome struct {
	Token  string
	Status string
	Qty    int
	Code   string // business refusal; "" on success
	Exp    string
	OK     bool // decided (success or business refusal)
}

// call sends one mutation until it is decided: transport errors,
// non-200 answers, top-level errors, UNAVAILABLE and RATE_LIMITED are
// retried (on any live instance) with the same arguments, which is safe
// because reserve carries an idempotency key and commit/cancel are
// idempotent on the token.
func (d *drop) call(ctx context.Context, client *http.Client, token, field, query string, vars map[string]any) outcome {
	return d.callOn(ctx, client, nil, token, field, query, vars)
}

// callOn is call sent to pin while it is alive (any live instance otherwise).
func (d *drop) callOn(ctx context.Context, client *http.Client, pin *proc, token, field, query string, vars map[string]any) outcome {
	backoff := 20 * time.Millisecond
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			d.Retries.Add(1)
			select {
			case <-ctx.Done():
				d.Unresolved.Add(1)
				return outcome{}
			case <-time.After(backoff + rand.N(backoff)):
			}
			backoff = min(backoff*2, 500*time.Millisecond)
		}
		if ctx.Err() != nil {
			d.Unresolved.Add(1)
			return outcome{}
		}
		live := d.s.live()
		if len(live) == 0 {
			continue
		}
		p := live[rand.IntN(len(live))]
		if pin != nil && pin.alive() {
			p = pin
		}
		base := p.URL
		if d.s.Front != "" {
			base = d.s.Front
		}
		d.Requests.Add(1)
		rctx, cancel := context.WithTimeout(ctx, 8*time.Second)
		r := post(rctx, client, base, token, query, vars)
		cancel()
		if r.Err != nil || r.Status != http.StatusOK {
			continue
		}
		if len(r.Errors) > 0 {
			d.Internal.Add(1)
			d.mu.Lock()
			if len(d.internals) < 5 {
				d.internals = append(d.internals, fmt.Sprintf("%s: %s %v", field, r.Errors[0].Message, r.Errors[0].Extensions))
			}
			d.mu.Unlock()
			continue
		}
		var payload map[string]struct {
			Reservation *struct {
				Token     string `json:"token"`
				Status    string `json:"status"`
				Quantity  int    `json:"quantity"`
				ExpiresAt string `json:"expiresAt"`
			} `json:"reservation"`
			UserErrors []userError `json:"userErrors"`
		}
		if err := json.Unmarshal(r.Data, &payload); err != nil {
			continue
		}
		pl := payload[field]
		if len(pl.UserErrors) > 0 {
			code := pl.UserErrors[0].Code
			if code == "UNAVAILABLE" || code == "RATE_LIMITED" {
				continue
			}
			d.count(p, field)
			return outcome{Code: code, OK: true}
		}
		if pl.Reservation == nil {
			continue
		}
		d.count(p, field)
		return outcome{Token: pl.Reservation.Token, Status: pl.Reservation.Status, Qty: pl.Reservation.Quantity,
			Exp: pl.Reservation.ExpiresAt, OK: true}
	}
}

// count records that p decided a call of field.
func (d *drop) count(p *proc, field string) {
	d.mu.Lock()
	d.served[p.Name+"/"+field]++
	d.mu.Unlock()
}

// servedBy returns how many calls of field p decided so far.
func (d *drop) servedBy(p *proc, field string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.served[p.Name+"/"+field]
}

func (d *drop) buyer(ctx context.Context, client *http.Client, i int) {
	user := fmt.Sprintf("%s-b%04d", d.cfg.SKU, i)
	bearer, err := d.s.Issuer.Mint(user, false, 2*time.Hour)
	if err != nil {
		panic(err)
	}
	qty := 1 + i%d.cfg.MaxQty
	vars := map[string]any{"input": map[string]any{
		"sku": d.cfg.SKU, "quantity": qty, "idempotencyKey": "cart-" + user, "holdSeconds": d.cfg.HoldSeconds}}
	op := d.rec.begin(user, opReserve, "", qty)
	res := d.call(ctx, client, bearer, "reserve", reserveMutation, vars)
	d.rec.end(op, res)
	if !res.OK || res.Code != "" {
		return
	}
	d.mu.Lock()
	d.holds[res.Token] = holdInfo{Buyer: user, Qty: res.Qty}
	d.mu.Unlock()

	select {
	case <-ctx.Done():
	case <-time.After(rand.N(d.cfg.Think)):
	}
	roll := rand.Float64()
	switch {
	case roll < d.cfg.Commit:
		n := 1
		if rand.Float64() < d.cfg.DoubleCommit {
			n = 2
		}
		var wg sync.WaitGroup
		for range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				op := d.rec.begin(user, opCommit, res.Token, qty)
				out := d.call(ctx, client, bearer, "commit", commitMutation, map[string]any{"token": res.Token})
				d.rec.end(op, out)
				d.settle(res.Token, out, "COMMITTED", d.committed)
			}()
		}
		wg.Wait()
	case roll < d.cfg.Commit+d.cfg.Cancel:
		op := d.rec.begin(user, opCancel, res.Token, qty)
		out := d.call(ctx, client, bearer, "cancel", cancelMutation, map[string]any{"token": res.Token})
		d.rec.end(op, out)
		d.settle(res.Token, out, "CANCELLED", d.cancelled)
	}
}

func (d *drop) settle(token string, out outcome, want string, acked map[string]bool) {
	if !out.OK {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if out.Code == "" && out.Status == want {
		acked[token] = true
		return
	}
	if out.Code == "" {
		d.refused[token] = "status " + out.Status
		return
	}
	d.refused[token] = out.Code
}

// figures is one scenario's line for docs/reliability.md.
func (d *drop) figures(t *testing.T, scenario string, faults int, extra string) {
	t.Helper()
	d.mu.Lock()
	defer d.mu.Unlock()
	t.Logf("FIGURES %s: requests=%d retries=%d buyers=%d holds=%d commits=%d cancels=%d refused=%d samples=%d faults=%d internal=%d unresolved=%d violations=0 %s",
		scenario, d.Requests.Load(), d.Retries.Load(), d.Finished.Load(), len(d.holds), len(d.committed), len(d.cancelled),
		len(d.refused), d.Samples.Load(), faults, d.Internal.Load(), d.Unresolved.Load(), extra)
}

// verifyOpts relaxes what a fault is allowed to lose, as the honest edges of
// docs/design.md state.
type verifyOpts struct {
	// RedisLost: Redis lost its data, so holds (and cancels) whose events had
	// not reached Postgres may be gone; commits may not.
	RedisLost bool
}

// verify runs every post-fault check. It waits for the system to settle:
// every hold ended (committed, cancelled or expired) and the write-behind
// drained.
func (d *drop) verify(t *testing.T, o verifyOpts) {
	t.Helper()
	s, sku := d.s, d.cfg.SKU
	d.mu.Lock()
	defer d.mu.Unlock()

	// Clients: nothing undecided, nothing oversold at any sampled instant.
	require.Empty(t, d.samples, "Redis counters broke an invariant during the drop")
	require.Zero(t, d.Unresolved.Load(), "operations never decided (the service did not recover in time)")
	for tok := range d.committed {
		require.False(t, d.cancelled[tok], "token %s acknowledged as both committed and cancelled", tok)
	}

	// The service answers again.
	for _, p := range s.live() {
		s.waitReady(p, 30*time.Second)
	}

	// Every hold ends: the abandoned ones expire.
	eventually(t, time.Duration(d.cfg.HoldSeconds+20)*time.Second, "every hold ended", func() (bool, string) {
		st := s.stockOf(sku)
		return st.Held == 0, fmt.Sprintf("%+v", st)
	})
	st := s.stockOf(sku)
	require.Equal(t, st.Total, st.Available+st.Held+st.Sold, "available + held + sold == total in Redis: %+v", st)
	require.LessOrEqual(t, st.Sold, st.Total)
	require.Equal(t, d.cfg.Total, st.Total)

	// The write-behind drains: Postgres has no HELD reservation left (Redis has none).
	// The rows still HELD are named in the last tries only: the message of
	// a failure, not a cost of every poll.
	explainAfter := time.Now().Add(28 * time.Second)
	eventually(t, 30*time.Second, "the write-behind drained", func() (bool, string) {
		held := s.scalar(`SELECT coalesce(sum(quantity), 0)::int FROM reservations WHERE sku = $1 AND status = 'HELD'`, sku)
		var missing []string
		if !o.RedisLost {
			for tok := range d.holds {
				if s.scalar(`SELECT count(*)::int FROM stock_movements WHERE event_id = $1`, "reserve:"+tok) == 0 {
					missing = append(missing, tok)
				}
			}
		}
		why := fmt.Sprintf("held in Postgres %d, reserve movements missing %d", held, len(missing))
		if (held > 0 || len(missing) > 0) && time.Now().After(explainAfter) {
			why += s.explainHeld(sku, missing)
		}
		return held == 0 && len(missing) == 0, why
	})

	// Postgres: no oversell, sold matches the sales, and Redis.
	pgSold := s.scalar(`SELECT sold FROM products WHERE sku = $1`, sku)
	pgTotal := s.scalar(`SELECT total FROM products WHERE sku = $1`, sku)
	salesQty := s.scalar(`SELECT coalesce(sum(quantity), 0)::int FROM sales WHERE sku = $1`, sku)
	require.LessOrEqual(t, pgSold, pgTotal, "oversold in Postgres")
	require.Equal(t, salesQty, pgSold, "products.sold equals the sales rows")
	require.Equal(t, pgSold, st.Sold, "Redis sold equals Postgres sold")

	// Every acknowledged commit is a sale; no acknowledged cancel is.
	sales := map[string]int{}
	rows, err := s.Pool.Query(context.Background(), `SELECT token, quantity FROM sales WHERE sku = $1`, sku)
	require.NoError(t, err)
	for rows.Next() {
		var tok string
		var q int
		require.NoError(t, rows.Scan(&tok, &q))
		sales[tok] = q
	}
	require.NoError(t, rows.Err())
	var lost []string
	for tok := range d.committed {
		if _, ok := sales[tok]; !ok {
			lost = append(lost, tok)
		}
	}
	sort.Strings(lost)
	require.Empty(t, lost, "acknowledged commits missing from sales")
	for tok := range d.cancelled {
		_, sold := sales[tok]
		require.False(t, sold, "acknowledged cancel %s was sold", tok)
	}
	for tok, q := range sales {
		h, ok := d.holds[tok]
		require.True(t, ok, "sale %s of a hold no client was given", tok)
		require.Equal(t, h.Qty, q, "sale %s quantity", tok)
	}
	// A commit refused as EXPIRED or ALREADY_CANCELLED was not sold.
	for tok, code := range d.refused {
		if code == "EXPIRED" || code == "ALREADY_CANCELLED" {
			_, sold := sales[tok]
			require.False(t, sold && !d.committed[tok], "refused (%s) hold %s was sold", code, tok)
		}
	}

	// The ledger: no event doubled, no token both sold and released, every
	// sale with its movement and a COMMITTED reservation.
	require.Equal(t, s.scalar(`SELECT count(*)::int FROM stock_movements`), s.scalar(`SELECT count(DISTINCT event_id)::int FROM stock_movements`))
	require.Zero(t, s.scalar(`SELECT count(*)::int FROM (SELECT token FROM stock_movements
		WHERE sku = $1 AND kind IN ('commit', 'cancel', 'expire') GROUP BY token HAVING count(*) > 1) x`, sku),
		"a token was both sold and released, or released twice")
	require.Zero(t, s.scalar(`SELECT count(*)::int FROM sales s WHERE sku = $1 AND NOT EXISTS
		(SELECT 1 FROM stock_movements m WHERE m.event_id = 'commit:' || s.token)`, sku), "sale without its commit movement")
	require.Zero(t, s.scalar(`SELECT count(*)::int FROM sales s JOIN reservations r USING (token)
		WHERE s.sku = $1 AND r.status <> 'COMMITTED'`, sku), "sale whose reservation is not COMMITTED")
	require.Zero(t, s.scalar(`SELECT count(*)::int FROM reservations r WHERE sku = $1 AND status = 'COMMITTED'
		AND NOT EXISTS (SELECT 1 FROM sales s WHERE s.token = r.token)`, sku), "COMMITTED reservation without a sale")
	if !o.RedisLost {
		// One idempotency key per buyer: one hold per buyer, however often
		// the request was retried or its reply lost.
		require.Zero(t, s.scalar(`SELECT count(*)::int FROM (SELECT principal FROM reservations WHERE sku = $1
			GROUP BY principal HAVING count(*) > 1) x`, sku), "a buyer got two holds for one idempotency key")
		for tok := range d.cancelled {
			require.Equal(t, 1, s.scalar(`SELECT count(*)::int FROM stock_movements WHERE event_id = $1`, "cancel:"+tok), "cancel movement of %s", tok)
		}
		// Units balance in the ledger: reserved = sold + released.
		reserved := s.scalar(`SELECT coalesce(sum(quantity), 0)::int FROM stock_movements WHERE sku = $1 AND kind = 'reserve'`, sku)
		released := s.scalar(`SELECT coalesce(sum(quantity), 0)::int FROM stock_movements WHERE sku = $1 AND kind IN ('cancel', 'expire')`, sku)
		require.Equal(t, reserved, pgSold+released, "ledger: reserved units = sold + released")
	}

	// Row by row, the ledger and Redis tell the same story.
	s.requireLedgerAgreesWithRedis(t, sku)

	// Top-level errors are reported, not tolerated silently.
	if d.Internal.Load() > 0 {
		t.Logf("top-level errors during the drop: %d, e.g. %s", d.Internal.Load(), strings.Join(d.internals, " | "))
	}
}

// explainHeld names the ledger's HELD rows of sku (and the holds whose
// reserve movement is missing): each row, the ledger's movements of its
// token, and what Redis has of its hold and in its partition's outbox.
func (s *system) explainHeld(sku string, missing []string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var b strings.Builder
	rows, err := s.Pool.Query(ctx, `SELECT token, quantity, status, expires_at, created_at FROM reservations WHERE sku = $1 AND status = 'HELD'`, sku)
	if err != nil {
		return "; " + err.Error()
	}
	var toks []string
	for rows.Next() {
		var tok, st string
		var q int
		var exp, created time.Time
		if rows.Scan(&tok, &q, &st, &exp, &created) == nil {
			toks = append(toks, tok)
			fmt.Fprintf(&b, "\n  ledger %s %s q=%d created=%s expires=%s", tok, st, q, created.Format("15:04:05.000"), exp.Format("15:04:05.000"))
		}
	}
	rows.Close()
	toks = append(toks, missing...)
	p := s.Keys.PartitionOf(sku)
	outbox, _ := s.RDB.XRange(ctx, s.Keys.Outbox(p), "-", "+").Result()
	dead, _ := s.RDB.XRange(ctx, s.Keys.DeadLetters(p), "-", "+").Result()
	pending := map[string]string{} // outbox entry -> the consumer it is pending on, and for how long
	pend, _ := s.RDB.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: s.Keys.Outbox(p), Group: "dropline", Start: "-", End: "+", Count: 10000}).Result()
	for _, e := range pend {
		pending[e.ID] = fmt.Sprintf(" pending on %s for %s (delivered %d times)", e.Consumer, e.Idle, e.RetryCount)
	}
	for _, tok := range toks {
		mv, err := s.Pool.Query(ctx, `SELECT event_id, kind, quantity, occurred_at FROM stock_movements WHERE token = $1 ORDER BY occurred_at`, tok)
		if err == nil {
			for mv.Next() {
				var id, kind string
				var q int
				var at time.Time
				if mv.Scan(&id, &kind, &q, &at) == nil {
					fmt.Fprintf(&b, "\n    movement %s %s q=%d at=%s", id, kind, q, at.Format("15:04:05.000"))
				}
			}
			mv.Close()
		}
		h, _ := s.RDB.HGetAll(ctx, s.Keys.Hold(p, tok)).Result()
		fmt.Fprintf(&b, "\n    redis hold %s: %v", tok, h)
		for _, kind := range []struct {
			name string
			msgs []redis.XMessage
		}{{"outbox", outbox}, {"dead", dead}} {
			for _, m := range kind.msgs {
				if m.Values["tok"] == tok {
					fmt.Fprintf(&b, "\n    %s %s %v%s", kind.name, m.ID, m.Values, pending[m.ID])
				}
			}
		}
	}
	fmt.Fprintf(&b, "\n  outbox length %d, pending %d, dead letters %d", len(outbox), len(pend), len(dead))
	return b.String()
}
