package faults

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/internal/testenv"
	"github.com/dropline/dropline/internal/webhooktest"
	"github.com/dropline/dropline/webhook"
)

// fastWebhookEnv makes the dispatcher retry within a test's patience.
var fastWebhookEnv = map[string]string{
	"DROPLINE_WEBHOOK_TIMEOUT":      "300ms",
	"DROPLINE_WEBHOOK_BACKOFF":      "50ms",
	"DROPLINE_WEBHOOK_BACKOFF_MAX":  "400ms",
	"DROPLINE_WEBHOOK_MAX_ATTEMPTS": "100",
}

// subscribe creates an endpoint for every event type over GraphQL, as an
// admin, with the secret Dropline makes, and returns its id and secret.
func (s *system) subscribe(p *proc, url string) (id, secret string) {
	s.t.Helper()
	var out struct {
		CreateWebhookEndpoint struct {
			Endpoint struct {
				ID     string `json:"id"`
				Secret string `json:"secret"`
			} `json:"endpoint"`
			UserErrors []userError `json:"userErrors"`
		} `json:"createWebhookEndpoint"`
	}
	s.mustGQL(p, s.token("ops", true), `mutation($i: CreateWebhookEndpointInput!) {
		createWebhookEndpoint(input: $i) { endpoint { id secret } userErrors { code message } } }`,
		map[string]any{"i": map[string]any{"url": url, "eventTypes": webhook.Types, "description": "e2e"}}, &out)
	require.Empty(s.t, out.CreateWebhookEndpoint.UserErrors)
	return out.CreateWebhookEndpoint.Endpoint.ID, out.CreateWebhookEndpoint.Endpoint.Secret
}

// recordedEvent is one row of the outbox, with its delivery to an endpoint.
type recordedEvent struct {
	ID      int64
	Type    string
	SKU     string
	Payload []byte
	Status  string
}

// outbox reads an endpoint's deliveries from the ledger, by event id.
func (s *system) outbox(endpoint string) []recordedEvent {
	s.t.Helper()
	rows, err := s.Pool.Query(context.Background(), `SELECT e.id, e.type, e.sku, e.payload::text, d.status
		FROM webhook_deliveries d JOIN webhook_events e ON e.id = d.event_id
		WHERE d.endpoint_id = $1 ORDER BY e.id`, endpoint)
	require.NoError(s.t, err)
	defer rows.Close()
	var out []recordedEvent
	for rows.Next() {
		var r recordedEvent
		var payload string
		require.NoError(s.t, rows.Scan(&r.ID, &r.Type, &r.SKU, &payload, &r.Status))
		r.Payload = []byte(payload)
		out = append(out, r)
	}
	require.NoError(s.t, rows.Err())
	return out
}

// TestWebhooksDeliveredAsTheLedgerRecordedThem: two instances sell two
// products to buyers who commit, cancel and abandon holds, one product is
// restocked once sold out, while a receiver that verifies every signature
// fails and hangs on purpose, goes away for two seconds mid-drop, and one
// instance is SIGKILLed mid-drop. Afterwards every event the ledger
// recorded reached the receiver byte for byte, each product's in the
// order recorded, none that was not recorded; and the events are the
// ledger's: one sale.committed per sale with its row's values, the
// sell-outs, the restock and the return to stock where the ledger has them.
func TestWebhooksDeliveredAsTheLedgerRecordedThem(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	for k, v := range fastWebhookEnv {
		s.Env[k] = v
	}
	a := s.start("a")
	b := s.start("b")
	recv := webhooktest.New(t, "", webhooktest.Flaky)
	endpoint, secret := s.subscribe(a, recv.URL)
	recv.SetSecret(t, secret)

	d1 := startDrop(s, dropConfig{SKU: "HOOK-1", Total: 30, Buyers: scale(90, 300), Pace: 10 * time.Millisecond})
	d2 := startDrop(s, dropConfig{SKU: "HOOK-2", Total: 30, Buyers: scale(90, 300), Pace: 10 * time.Millisecond})
	d1.waitProgress(t, d1.cfg.Buyers/3)
	recv.Stop()
	gone := time.Now()
	d1.waitProgress(t, d1.cfg.Buyers/2)
	a.kill(t)
	killed := time.Now()
	time.Sleep(max(0, 2*time.Second-time.Since(gone))) // the receiver stays away 2 s
	recv.Restart(t)
	a = s.start("a2")
	d1.wait(t)
	d2.wait(t)
	d1.verify(t, verifyOpts{})
	d2.verify(t, verifyOpts{})

	// Sell one product out (what the buyers left), restock it, sell again.
	s.sellOut(a, "HOOK-1")
	var rs struct {
		Restock struct {
			UserErrors []userError `json:"userErrors"`
		} `json:"restock"`
	}
	s.mustGQL(a, s.token("ops", true), `mutation($i: RestockInput!) { restock(input: $i) { userErrors { code message } } }`,
		map[string]any{"i": map[string]any{"sku": "HOOK-1", "quantity": 2, "eventId": "po-77"}}, &rs)
	require.Empty(t, rs.Restock.UserErrors)
	s.sellOut(a, "HOOK-1")

	began := time.Now()
	eventually(t, 90*time.Second, "every delivery settled", func() (bool, string) {
		n := s.scalar(`SELECT count(*) FROM webhook_deliveries WHERE status <> 'DELIVERED'`)
		return n == 0, fmt.Sprintf("%d not delivered", n)
	})
	recorded := s.outbox(endpoint)
	got := recv.Accepted()
	dups := requireArrivedAsRecorded(t, recorded, got)
	require.Empty(t, recv.BadSignatures(), "every request verifies")
	s.requireEventsAreTheLedgers(t, recorded)
	t.Logf("FIGURES webhooks: events=%d requests=%d accepted=%d duplicates=%d settled_after_drop=%s",
		len(recorded), recv.Requests(), len(got), dups, time.Since(began).Round(time.Millisecond))

	// The metrics say what happened, by endpoint. Each instance counts its
	// own attempts, and either may have claimed any delivery, so the live
	// two together count at least every delivery made after the kill (the
	// killed one's count went with it). An attempt is counted just after
	// its outcome is recorded, and the backlog gauges are read from the
	// ledger every few seconds: both are waited for.
	afterKill := s.scalar(`SELECT count(*) FROM webhook_deliveries WHERE endpoint_id = $1 AND delivered_at > $2`, endpoint, killed)
	require.Positive(t, afterKill, "deliveries made after the kill")
	delivered := `dropline_webhook_attempts_total{endpoint="` + endpoint + `",outcome="delivered"}`
	var byA, byB float64
	eventually(t, 10*time.Second, "the live instances count every delivery made after the kill", func() (bool, string) {
		byA, byB = metricValue(t, a, delivered), metricValue(t, b, delivered)
		return byA+byB >= float64(afterKill), fmt.Sprintf("%d delivered after the kill, counted %v by a2 and %v by b", afterKill, byA, byB)
	})
	for _, p := range []*proc{a, b} {
		eventually(t, 15*time.Second, p.Name+" reports no dead letter", func() (bool, string) {
			return strings.Contains(s.metricsText(p), `dropline_webhook_dead_letters{endpoint="`+endpoint+`"} 0`), "no such series"
		})
	}
	t.Logf("FIGURES webhooks: delivered_after_kill=%d counted_by_a2=%.0f counted_by_b=%.0f", afterKill, byA, byB)
}

// sellOut reserves and commits what is left of sku, one unit at a time.
func (s *system) sellOut(p *proc, sku string) {
	s.t.Helper()
	for i := 0; ; i++ {
		buyer := s.token(fmt.Sprintf("%s-last-%d", sku, i), false)
		var r struct {
			Reserve struct {
				Reservation *struct {
					Token string `json:"token"`
				} `json:"reservation"`
				UserErrors []userError `json:"userErrors"`
			} `json:"reserve"`
		}
		s.mustGQL(p, buyer, reserveMutation, map[string]any{"input": map[string]any{"sku": sku, "quantity": 1}}, &r)
		if r.Reserve.Reservation == nil {
			require.Equal(s.t, "OUT_OF_STOCK", r.Reserve.UserErrors[0].Code)
			// Units still held by the drop's buyers come back at their expiry.
			if s.scalar(`SELECT total - sold FROM products WHERE sku = $1`, sku) == 0 {
				return
			}
			time.Sleep(100 * time.Millisecond)
			continue
		}
		var c struct {
			Commit struct {
				UserErrors []userError `json:"userErrors"`
			} `json:"commit"`
		}
		s.mustGQL(p, buyer, commitMutation, map[string]any{"token": r.Reserve.Reservation.Token}, &c)
		require.Empty(s.t, c.Commit.UserErrors)
	}
}

// requireArrivedAsRecorded is webhooktest.RequireArrivedAsRecorded of the
// outbox's rows.
func requireArrivedAsRecorded(t *testing.T, recorded []recordedEvent, got []webhooktest.Received) (duplicates int) {
	t.Helper()
	rs := make([]webhooktest.Recorded, len(recorded))
	for i, r := range recorded {
		rs[i] = webhooktest.Recorded{MessageID: webhook.MessageID(r.ID), EventID: r.ID, Type: r.Type, SKU: r.SKU, Payload: r.Payload}
	}
	return webhooktest.RequireArrivedAsRecorded(t, rs, got)
}

// requireEventsAreTheLedgers compares the events with the ledger's rows:
// one sale.committed per sale, with the sale's values; per product, the
// sell-outs and returns to stock alternate and the last matches whether
// sold reached total; the restock is the stock movement.
func (s *system) requireEventsAreTheLedgers(t *testing.T, recorded []recordedEvent) {
	t.Helper()
	type saleData struct {
		Token, SKU, Principal, CommittedAt string
		Quantity                           int
	}
	rows, err := s.Pool.Query(context.Background(), `SELECT token, sku, principal, quantity, webhook_time(committed_at) FROM sales`)
	require.NoError(t, err)
	sales := map[string]saleData{}
	for rows.Next() {
		var d saleData
		require.NoError(t, rows.Scan(&d.Token, &d.SKU, &d.Principal, &d.Quantity, &d.CommittedAt))
		sales[d.Token] = d
	}
	rows.Close()
	require.NoError(t, rows.Err())

	stockEvents := map[string][]string{}
	for _, r := range recorded {
		var msg struct {
			Type      string          `json:"type"`
			Timestamp string          `json:"timestamp"`
			Data      json.RawMessage `json:"data"`
		}
		require.NoError(t, json.Unmarshal(r.Payload, &msg))
		require.Equal(t, r.Type, msg.Type)
		switch r.Type {
		case webhook.SaleCommitted:
			var d saleData
			require.NoError(t, json.Unmarshal(msg.Data, &d))
			want, ok := sales[d.Token]
			require.True(t, ok, "a sale.committed for %s, which the ledger did not sell", d.Token)
			require.Equal(t, want, d)
			require.Equal(t, want.CommittedAt, msg.Timestamp)
			delete(sales, d.Token)
		case webhook.Restock:
			var d struct {
				SKU, EventID string
				Quantity     int
			}
			require.NoError(t, json.Unmarshal(msg.Data, &d))
			require.Equal(t, "po-77", d.EventID)
			require.Equal(t, 2, d.Quantity)
			stockEvents[r.SKU] = append(stockEvents[r.SKU], r.Type)
		default:
			stockEvents[r.SKU] = append(stockEvents[r.SKU], r.Type)
		}
	}
	require.Empty(t, sales, "every sale has its sale.committed")
	for _, sku := range []string{"HOOK-1", "HOOK-2"} {
		soldOut := s.scalar(`SELECT (sold >= total)::int FROM products WHERE sku = $1`, sku) == 1
		ev := stockEvents[sku]
		if sku == "HOOK-1" {
			i := slices.Index(ev, webhook.Restock)
			require.Positive(t, i, "HOOK-1 was restocked after selling out: %v", ev)
			require.Equal(t, webhook.ProductBackInStock, ev[i+1], "%v", ev)
			ev = slices.Delete(ev, i, i+1)
		}
		for i, e := range ev {
			want := webhook.ProductSoldOut
			if i%2 == 1 {
				want = webhook.ProductBackInStock
			}
			require.Equal(t, want, e, "%s: %v", sku, ev)
		}
		require.Equal(t, soldOut, len(ev)%2 == 1, "%s: sold out %v, events %v", sku, soldOut, ev)
	}
}

// metricsText reads an instance's /metrics.
func (s *system) metricsText(p *proc) string {
	s.t.Helper()
	resp, err := quickClient.Get(p.URL + "/metrics")
	require.NoError(s.t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(s.t, err)
	return string(b)
}

// TestHangingWebhookDoesNotSlowReserves measures reserves and commits
// through GraphQL against the binary with no endpoint, then with an
// endpoint subscribed to every event that hangs every request for the
// whole timeout (its backlog growing all along), alternated three times:
// the reserve's p99 with the hanging endpoint stays within twice the
// baseline's plus 5 ms, and the same for the commit, which writes the
// outbox in its transaction.
func TestHangingWebhookDoesNotSlowReserves(t *testing.T) {
	testenv.Quiet(t)
	s := newSystem(t)
	s.Env["DROPLINE_WEBHOOK_TIMEOUT"] = "10s"
	s.Env["DROPLINE_MUTATION_RATE"] = "-1"
	p := s.start("a")
	hang := webhooktest.New(t, "", func(string, int) webhooktest.Answer { return webhooktest.Hang })
	s.createProduct(p, "HANG-1", 100_000, 0)
	admin := s.token("ops", true)

	const perRound = 150
	var base, hung [2][]time.Duration // reserve, commit
	endpoint := ""
	for round := range 6 {
		withHook := round%2 == 1
		switch {
		case withHook && endpoint == "":
			var secret string
			endpoint, secret = s.subscribe(p, hang.URL)
			hang.SetSecret(t, secret)
		case withHook:
			s.mustGQL(p, admin, `mutation($i: UpdateWebhookEndpointInput!) { updateWebhookEndpoint(input: $i) { userErrors { code } } }`,
				map[string]any{"i": map[string]any{"id": endpoint, "enabled": true}}, nil)
		case endpoint != "":
			s.mustGQL(p, admin, `mutation($i: UpdateWebhookEndpointInput!) { updateWebhookEndpoint(input: $i) { userErrors { code } } }`,
				map[string]any{"i": map[string]any{"id": endpoint, "enabled": false}}, nil)
		}
		r, c := s.timeSales(t, p, "HANG-1", fmt.Sprintf("r%d", round), perRound)
		if withHook {
			hung[0], hung[1] = append(hung[0], r...), append(hung[1], c...)
		} else {
			base[0], base[1] = append(base[0], r...), append(base[1], c...)
		}
	}
	require.Positive(t, hang.Requests(), "the endpoint was being sent to, and hung")
	require.Empty(t, hang.BadSignatures())
	pending := s.scalar(`SELECT count(*) FROM webhook_deliveries WHERE status = 'PENDING'`)
	for i, what := range []string{"reserve", "commit"} {
		b50, b99 := percentile(base[i], 50), percentile(base[i], 99)
		h50, h99 := percentile(hung[i], 50), percentile(hung[i], 99)
		t.Logf("FIGURES hanging-webhook %s: no endpoint p50=%s p99=%s; hanging endpoint p50=%s p99=%s (n=%d each, %d deliveries pending, %d requests hung)",
			what, b50, b99, h50, h99, len(base[i]), pending, hang.Requests())
		require.LessOrEqual(t, h99, 2*b99+5*time.Millisecond, "%s p99 with a hanging endpoint", what)
	}
}

// timeSales reserves and commits n units one after another, each by its own
// buyer, and returns each reserve's and each commit's latency.
func (s *system) timeSales(t *testing.T, p *proc, sku, round string, n int) (reserves, commits []time.Duration) {
	t.Helper()
	client := &http.Client{Timeout: 10 * time.Second}
	defer client.CloseIdleConnections()
	ctx := context.Background()
	for i := range n {
		buyer := s.token(fmt.Sprintf("%s-%s-%d", sku, round, i), false)
		began := time.Now()
		r := post(ctx, client, p.URL, buyer, reserveMutation, map[string]any{"input": map[string]any{"sku": sku, "quantity": 1}})
		took := time.Since(began)
		require.NoError(t, r.Err)
		require.Empty(t, r.Errors)
		var out struct {
			Reserve struct {
				Reservation struct {
					Token string `json:"token"`
				} `json:"reservation"`
			} `json:"reserve"`
		}
		require.NoError(t, json.Unmarshal(r.Data, &out))
		began = time.Now()
		c := post(ctx, client, p.URL, buyer, commitMutation, map[string]any{"token": out.Reserve.Reservation.Token})
		ctook := time.Since(began)
		require.NoError(t, c.Err)
		require.Empty(t, c.Errors)
		require.False(t, strings.Contains(string(c.Data), `"code"`), "%s", c.Data)
		reserves, commits = append(reserves, took), append(commits, ctook)
	}
	return reserves, commits
}

func percentile(ds []time.Duration, p int) time.Duration {
	s := slices.Clone(ds)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[min(len(s)-1, len(s)*p/100)].Round(10 * time.Microsecond)
}
