package worker

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/db"
	"github.com/dropline/dropline/internal/testenv"
	"github.com/dropline/dropline/internal/webhooktest"
	"github.com/dropline/dropline/inventory"
	"github.com/dropline/dropline/webhook"
)

// fastWebhooks shortens the dispatcher's clock so tests finish in seconds.
func fastWebhooks(owner string) WebhookDispatcherConfig {
	return WebhookDispatcherConfig{
		Options: Options{Owner: owner, StepTimeout: 5 * time.Second},
		Poll:    20 * time.Millisecond, Timeout: 200 * time.Millisecond,
		MinBackoff: 10 * time.Millisecond, MaxBackoff: 80 * time.Millisecond, MaxAttempts: 50,
		BacklogInterval: 50 * time.Millisecond,
	}
}

// startDispatcher starts a dispatcher on the bundle's ledger, with its test
// signal, and stops it when the test ends.
func (b *bundle) startDispatcher(t *testing.T, cfg WebhookDispatcherConfig) (*WebhookDispatcher, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	d := NewWebhookDispatcher(cfg, b.engine.Ledger(), b.log.With().Str("dispatcher", cfg.Owner).Logger(), reg)
	d.attempted.Init()
	require.NoError(t, d.Start(b.ctx))
	t.Cleanup(func() { stop(t, d) })
	return d, reg
}

// subscribe creates an endpoint for every event type.
func (b *bundle) subscribe(t *testing.T, url, secret string) db.WebhookEndpoint {
	t.Helper()
	e, err := webhook.NewService(b.engine.Ledger()).CreateEndpoint(b.ctx, admin, webhook.EndpointInput{
		URL: url, Secret: secret, EventTypes: webhook.Types})
	require.NoError(t, err)
	return e
}

// waitSettled waits, on the dispatchers' signals, until no delivery of the
// endpoint is pending.
func (b *bundle) waitSettled(t *testing.T, endpoint int64, within time.Duration, ds ...*WebhookDispatcher) {
	t.Helper()
	deadline := time.NewTimer(within)
	defer deadline.Stop()
	for {
		n, err := b.engine.Ledger().Webhooks().WebhookDeliveries(b.ctx, endpoint, db.WebhookPending, 0, 1)
		require.NoError(t, err)
		if len(n) == 0 {
			return
		}
		select {
		case <-ds[0].attempted.C():
		case <-signalOf(ds[1:]):
		case <-deadline.C:
			t.Fatalf("deliveries of endpoint %d still pending after %s (first: %d)", endpoint, within, n[0].EventID)
		}
	}
}

func signalOf(ds []*WebhookDispatcher) <-chan WebhookAttemptReport {
	if len(ds) == 0 {
		return nil
	}
	return ds[0].attempted.C()
}

// sell reserves and commits one unit of sku for each buyer, concurrently,
// and returns how many sold.
func (b *bundle) sell(t *testing.T, sku string, buyers int) int {
	t.Helper()
	sold, err := b.trySell(sku, buyers)
	require.NoError(t, err)
	return sold
}

// trySell is sell for any goroutine: an error instead of a failed test.
func (b *bundle) trySell(sku string, buyers int) (int, error) {
	var wg sync.WaitGroup
	errs := make(chan error, buyers)
	for i := range buyers {
		wg.Go(func() {
			who := inventory.Principal{ID: fmt.Sprintf("buyer-%s-%d", sku, i)}
			r, err := b.engine.Reserve(b.ctx, who, inventory.ReserveRequest{SKU: sku, Quantity: 1, HoldFor: time.Minute})
			if err != nil {
				errs <- err
				return
			}
			_, err = b.engine.Commit(b.ctx, who, r.Token)
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	sold := 0
	for err := range errs {
		switch {
		case err == nil:
			sold++
		case !errors.Is(err, inventory.ErrOutOfStock):
			return sold, err
		}
	}
	return sold, nil
}

// webhookOutbox is an endpoint's deliveries as the ledger has them, by event id.
func (b *bundle) webhookOutbox(t *testing.T, endpoint int64, status string) []db.WebhookDelivery {
	t.Helper()
	var out []db.WebhookDelivery
	after := int64(0)
	for {
		page, err := b.engine.Ledger().Webhooks().WebhookDeliveries(b.ctx, endpoint, status, after, 100)
		require.NoError(t, err)
		out = append(out, page...)
		if len(page) < 100 {
			return out
		}
		after = page[len(page)-1].EventID
	}
}

// requireReceivedAsRecorded is webhooktest.RequireArrivedAsRecorded of the
// ledger's deliveries.
func requireReceivedAsRecorded(t *testing.T, recorded []db.WebhookDelivery, got []webhooktest.Received) (duplicates int) {
	t.Helper()
	rs := make([]webhooktest.Recorded, len(recorded))
	for i, d := range recorded {
		rs[i] = webhooktest.Recorded{MessageID: webhook.MessageID(d.EventID), EventID: d.EventID, Type: d.Type, SKU: d.SKU, Payload: d.Payload}
	}
	return webhooktest.RequireArrivedAsRecorded(t, rs, got)
}

// TestWebhooksArriveAsRecordedInOrderThroughFailures sells three products
// out (one restocked and sold out again) while two dispatchers, as two
// processes would, deliver to a receiver that fails and hangs on purpose:
// every event the ledger recorded arrives, signed, byte for byte, each
// product's in order, and the events are exactly the ledger's sales,
// sell-outs and restocks.
func TestWebhooksArriveAsRecordedInOrderThroughFailures(t *testing.T) {
	t.Parallel()
	b := setup(t)
	secret := webhook.NewSecret()
	recv := webhooktest.New(t, secret, webhooktest.Flaky)
	ep := b.subscribe(t, recv.URL, secret)
	skus := []string{"WH-A", "WH-B", "WH-C"}
	for _, sku := range skus {
		_, err := b.engine.Catalog().CreateProduct(b.ctx, admin, inventory.ProductInput{SKU: sku, Name: sku,
			Price: inventory.Money{Amount: 1500, Currency: "EUR"}, Stock: 8})
		require.NoError(t, err)
	}
	d1, _ := b.startDispatcher(t, fastWebhooks("one"))
	d2, _ := b.startDispatcher(t, fastWebhooks("two"))

	var wg sync.WaitGroup
	sold := make([]int, len(skus))
	errs := make([]error, len(skus))
	for i, sku := range skus {
		wg.Go(func() { sold[i], errs[i] = b.trySell(sku, 12) })
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	_, err := b.engine.Catalog().Restock(b.ctx, admin, "WH-A", 3, "po-1")
	require.NoError(t, err)
	sold[0] += b.sell(t, "WH-A", 5)
	require.Equal(t, []int{11, 8, 8}, sold)

	b.waitSettled(t, ep.ID, 60*time.Second, d1, d2)
	recorded := b.webhookOutbox(t, ep.ID, db.WebhookDelivered)
	dups := requireReceivedAsRecorded(t, recorded, recv.Accepted())
	require.Empty(t, recv.BadSignatures())
	require.Empty(t, b.webhookOutbox(t, ep.ID, db.WebhookDead))

	// The events are the ledger's: one sale.committed per sale, the
	// sell-outs and the restock in their places.
	var sales int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM sales`).Scan(&sales))
	types := map[string][]string{}
	for _, d := range recorded {
		types[d.SKU] = append(types[d.SKU], d.Type)
		if d.Type == webhook.SaleCommitted {
			sales--
		}
	}
	require.Zero(t, sales, "one sale.committed per sale")
	require.Equal(t, []string{webhook.ProductSoldOut, webhook.Restock, webhook.ProductBackInStock, webhook.ProductSoldOut},
		without(types["WH-A"], webhook.SaleCommitted), "WH-A: %v", types["WH-A"])
	for _, sku := range skus[1:] {
		require.Equal(t, []string{webhook.ProductSoldOut}, without(types[sku], webhook.SaleCommitted), "%s: %v", sku, types[sku])
	}
	// Each sell-out comes right after the sale that made it.
	for sku, ts := range types {
		for i, ty := range ts {
			if ty == webhook.ProductSoldOut {
				require.Equal(t, webhook.SaleCommitted, ts[i-1], "%s: %v", sku, ts)
			}
		}
	}
	t.Logf("%d events, %d requests to the receiver, %d duplicates", len(recorded), recv.Requests(), dups)
}

func without(ts []string, drop string) []string {
	var out []string
	for _, t := range ts {
		if t != drop {
			out = append(out, t)
		}
	}
	return out
}

// TestWebhookDeadLettersAndRedelivery: an endpoint that always fails gets
// each delivery MaxAttempts times, then has it as a dead letter (counted in
// the metrics), and a redelivery sends the dead letters once it answers.
func TestWebhookDeadLettersAndRedelivery(t *testing.T) {
	t.Parallel()
	b := setup(t)
	secret := webhook.NewSecret()
	var mu sync.Mutex
	down := true
	recv := webhooktest.New(t, secret, func(string, int) webhooktest.Answer {
		mu.Lock()
		defer mu.Unlock()
		if down {
			return webhooktest.Fail
		}
		return webhooktest.Accept
	})
	ep := b.subscribe(t, recv.URL, secret)
	_, err := b.engine.Catalog().CreateProduct(b.ctx, admin, inventory.ProductInput{SKU: "WH-DEAD", Name: "dead",
		Price: inventory.Money{Amount: 100, Currency: "EUR"}, Stock: 3})
	require.NoError(t, err)
	cfg := fastWebhooks("one")
	cfg.MaxAttempts = 3
	cfg.Timeout = 5 * time.Second // every failure is the receiver's 500, never a slow attempt's timeout
	d, reg := b.startDispatcher(t, cfg)
	require.Equal(t, 3, b.sell(t, "WH-DEAD", 3))

	// 3 sales and the sell-out, each tried three times.
	deadline := time.After(30 * time.Second)
	for len(b.webhookOutbox(t, ep.ID, db.WebhookDead)) < 4 {
		select {
		case <-d.attempted.C():
		case <-deadline:
			t.Fatal("the deliveries did not become dead letters")
		}
	}
	dead := b.webhookOutbox(t, ep.ID, db.WebhookDead)
	for _, l := range dead {
		require.Equal(t, 3, l.Attempts)
		require.Equal(t, 500, l.LastStatus)
		require.Contains(t, l.LastError, "failing on purpose")
	}
	require.Equal(t, 12, recv.Requests())
	endpoint := strconv.FormatInt(ep.ID, 10)
	require.InDelta(t, 4, testutil.ToFloat64(d.dead.WithLabelValues(endpoint)), 0)
	require.InDelta(t, 4, testutil.ToFloat64(d.attempts.WithLabelValues(endpoint, "dead")), 0)
	require.InDelta(t, 8, testutil.ToFloat64(d.attempts.WithLabelValues(endpoint, "failed")), 0)
	n, err := testutil.GatherAndCount(reg, "dropline_webhook_dead_letters_total", "dropline_webhook_attempt_seconds")
	require.NoError(t, err)
	require.Positive(t, n)

	mu.Lock()
	down = false
	mu.Unlock()
	svc := webhook.NewService(b.engine.Ledger())
	revived, err := svc.Redeliver(b.ctx, admin, endpoint, []string{webhook.MessageID(dead[0].EventID)})
	require.NoError(t, err)
	require.Equal(t, 1, revived)
	revived, err = svc.Redeliver(b.ctx, admin, endpoint, nil)
	require.NoError(t, err)
	require.Equal(t, 3, revived)
	b.waitSettled(t, ep.ID, 30*time.Second, d)
	requireReceivedAsRecorded(t, b.webhookOutbox(t, ep.ID, db.WebhookDelivered), recv.Accepted())
	_, err = svc.Redeliver(b.ctx, inventory.Principal{ID: "buyer"}, endpoint, nil)
	require.ErrorIs(t, err, inventory.ErrForbidden)
}

// TestHangingEndpointDoesNotHoldUpAnother: one endpoint hangs every
// request until the sender's timeout, another answers at once; the second
// receives every event long before the first's first attempt has timed
// out, and the first still gets them all once it answers.
func TestHangingEndpointDoesNotHoldUpAnother(t *testing.T) {
	testenv.Quiet(t)
	b := setup(t)
	var mu sync.Mutex
	hang := true
	slowSecret, fastSecret := webhook.NewSecret(), webhook.NewSecret()
	slow := webhooktest.New(t, slowSecret, func(string, int) webhooktest.Answer {
		mu.Lock()
		defer mu.Unlock()
		if hang {
			return webhooktest.Hang
		}
		return webhooktest.Accept
	})
	fast := webhooktest.New(t, fastSecret, nil)
	slowEP := b.subscribe(t, slow.URL, slowSecret)
	fastEP := b.subscribe(t, fast.URL, fastSecret)
	skus := []string{"WH-H1", "WH-H2", "WH-H3", "WH-H4", "WH-H5", "WH-H6"}
	for _, sku := range skus {
		_, err := b.engine.Catalog().CreateProduct(b.ctx, admin, inventory.ProductInput{SKU: sku, Name: sku,
			Price: inventory.Money{Amount: 100, Currency: "EUR"}, Stock: 5})
		require.NoError(t, err)
	}
	cfg := fastWebhooks("one")
	cfg.Timeout = 3 * time.Second
	d, _ := b.startDispatcher(t, cfg)
	began := time.Now()
	for _, sku := range skus {
		require.Equal(t, 5, b.sell(t, sku, 5))
	}
	b.waitSettled(t, fastEP.ID, 10*time.Second, d)
	took := time.Since(began)
	require.Less(t, took, cfg.Timeout, "the answering endpoint waited for the hanging one")
	requireReceivedAsRecorded(t, b.webhookOutbox(t, fastEP.ID, db.WebhookDelivered), fast.Accepted())
	require.Empty(t, slow.Accepted())
	t.Logf("36 events reached the answering endpoint %s after the first sale, while the other hung", took.Round(time.Millisecond))

	mu.Lock()
	hang = false
	mu.Unlock()
	b.waitSettled(t, slowEP.ID, 30*time.Second, d)
	requireReceivedAsRecorded(t, b.webhookOutbox(t, slowEP.ID, db.WebhookDelivered), slow.Accepted())
}

// TestDrawDrawnWebhookRevealsTheSeed: a draw run once sends one draw.drawn,
// with the counts and the seed the ledger has, whose SHA-256 is the hash
// published before entries opened; running the draw again sends nothing.
func TestDrawDrawnWebhookRevealsTheSeed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	secret := webhook.NewSecret()
	recv := webhooktest.New(t, secret, nil)
	ep := b.subscribe(t, recv.URL, secret)
	_, err := b.engine.Catalog().CreateProduct(b.ctx, admin, inventory.ProductInput{
		SKU: "WH-DRAW", Name: "Draw", Price: inventory.Money{Amount: 1999, Currency: "EUR"}, Stock: 2,
		Draw: &inventory.DrawInput{ClosesAt: time.Now().Add(time.Hour), WinnerHold: time.Minute},
	})
	require.NoError(t, err)
	for i := range 5 {
		_, err := b.engine.Draws().EnterDraw(b.ctx, inventory.Principal{ID: fmt.Sprintf("entrant-%d", i)}, "WH-DRAW", 1)
		require.NoError(t, err)
	}
	_, err = b.pool.Exec(b.ctx, `UPDATE draws SET closes_at = clock_timestamp() WHERE sku = 'WH-DRAW'`)
	require.NoError(t, err)
	d, _ := b.startDispatcher(t, fastWebhooks("one"))
	for range 2 {
		_, err = b.engine.Draws().RunDraw(b.ctx, "WH-DRAW")
		require.NoError(t, err)
	}
	b.waitSettled(t, ep.ID, 30*time.Second, d)
	recorded := b.webhookOutbox(t, ep.ID, db.WebhookDelivered)
	requireReceivedAsRecorded(t, recorded, recv.Accepted())
	require.Len(t, recorded, 1, "one draw, one event")
	require.Equal(t, webhook.DrawDrawn, recorded[0].Type)
	var msg struct {
		Data struct {
			SKU, Seed, SeedHash     string
			Entries, Winners, Stock int
		}
	}
	require.NoError(t, json.Unmarshal(recorded[0].Payload, &msg))
	draw, err := b.engine.Ledger().Draws().Draw(b.ctx, "WH-DRAW")
	require.NoError(t, err)
	require.Equal(t, hex.EncodeToString(draw.Seed), msg.Data.Seed)
	require.Equal(t, draw.SeedHash, msg.Data.SeedHash)
	require.Equal(t, db.SeedHash(draw.Seed), msg.Data.SeedHash)
	require.Equal(t, 5, msg.Data.Entries)
	require.Equal(t, 2, msg.Data.Winners)
	require.Equal(t, 2, msg.Data.Stock)
}

// The backlog gauges are set in place: a scrape taken while measure runs
// finds every listed endpoint's series, and an endpoint deleted since the
// last measure loses its series while the others keep theirs.
func TestWebhookBacklogGaugesFollowTheEndpoints(t *testing.T) {
	t.Parallel()
	b := setup(t)
	kept := b.subscribe(t, "http://127.0.0.1:9/kept", webhook.NewSecret())
	gone := b.subscribe(t, "http://127.0.0.1:9/gone", webhook.NewSecret())
	_, err := b.engine.Catalog().CreateProduct(b.ctx, admin, inventory.ProductInput{SKU: "WH-GAUGE", Name: "gauge",
		Price: inventory.Money{Amount: 100, Currency: "EUR"}, Stock: 2})
	require.NoError(t, err)
	require.Equal(t, 2, b.sell(t, "WH-GAUGE", 2))
	pending := len(b.webhookOutbox(t, kept.ID, db.WebhookPending))
	require.Positive(t, pending)

	// Not started: nothing is sent, and measure is called here alone.
	reg := prometheus.NewRegistry()
	d := NewWebhookDispatcher(fastWebhooks("gauges"), b.engine.Ledger(), b.log, reg)
	k := strconv.FormatInt(kept.ID, 10)
	series := func() (kept, all int) {
		families, err := reg.Gather()
		if err != nil {
			return -1, -1 // counted as a miss; the test goroutine alone may fail the test
		}
		for _, f := range families {
			if f.GetName() != "dropline_webhook_dead_letters" {
				continue
			}
			for _, m := range f.GetMetric() {
				all++
				if m.GetLabel()[0].GetValue() == k {
					kept++
				}
			}
		}
		return kept, all
	}
	d.measure(b.ctx)
	require.Equal(t, 2, testutil.CollectAndCount(d.pending))
	require.Equal(t, float64(pending), testutil.ToFloat64(d.pending.WithLabelValues(k)))

	// Scrapes while measure runs again and again.
	done := make(chan struct{})
	missed := make(chan int, 1)
	go func() {
		n := 0
		for {
			select {
			case <-done:
				missed <- n
				return
			default:
			}
			if seen, _ := series(); seen != 1 {
				n++
			}
		}
	}()
	for range 200 {
		d.measure(b.ctx)
	}
	close(done)
	require.Zero(t, <-missed, "scrapes that found no series for a listed endpoint")

	_, err = b.engine.Ledger().Webhooks().DeleteWebhookEndpoint(b.ctx, gone.ID)
	require.NoError(t, err)
	d.measure(b.ctx)
	for _, g := range []*prometheus.GaugeVec{d.pending, d.deadWaiting, d.lag} {
		require.Equal(t, 1, testutil.CollectAndCount(g), "the deleted endpoint's series are gone")
	}
	seen, all := series()
	require.Equal(t, 1, seen)
	require.Equal(t, 1, all)
	require.Equal(t, float64(pending), testutil.ToFloat64(d.pending.WithLabelValues(k)))
}
