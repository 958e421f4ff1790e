package faults

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/internal/testenv"
	"github.com/dropline/dropline/internal/wsclient"
)

// Websocket abuse against the real binary (G9: subscription floods and
// slowloris websockets). The binary runs with its default StreamLimits (no
// environment variable changes them), so these tests meet the real caps: 32
// subscriptions per connection, 32 connections per principal, 256 per client
// address, connection_init within 3 s, messages of at most 64 KiB.
//
// One test process plays many clients: each group of attacking connections
// leaves from a loopback address of its own (all of 127.0.0.0/8 is local on
// Linux), so one group's per-address cap does not refuse another's, and the
// healthy subscriber, from 127.0.0.1, shares no cap with any attacker.
//
// The tests do not call t.Parallel: they assert delivery latency, so they run
// on their own, before the parallel drop scenarios load the machine.

// The binary's stream limits (graphql.StreamLimits defaults) and delivery
// interval, as the tests expect to meet them.
const (
	wsSubsPerConn       = 32
	wsConnsPerPrincipal = 32
	wsConnsPerIP        = 256
	wsInitTimeout       = 3 * time.Second
	wsMessageBytes      = 64 << 10
	// wsCoalesce is the hub's delivery interval per SKU (live.HubConfig.Interval).
	wsCoalesce = 100 * time.Millisecond
	// wsLatencyBudget is G8's 250 ms plus the coalescing interval: a change
	// within the interval after a delivery waits for the interval's end.
	wsLatencyBudget = 250*time.Millisecond + wsCoalesce
	// wsExcess is how many subscriptions beyond the cap each flood sends.
	wsExcess = 8
)

// Close codes: RFC 6455's, and Dropline's for a principal over its cap
// (graphql.CloseTooManyConnections).
const (
	closeProtocolError = 1002
	closeMessageTooBig = 1009
	closeTooManyConns  = 4429
)

const wsStockDoc = `subscription($s: [ID!]!) { stockChanged(skus: $s) { sku available held sold total } }`

// TestWSSubscriptionFlood floods each cap in turn (subscriptions on one
// connection, connections of one principal, connections from one address),
// holds all of it open, and checks that the refused excess got a clear
// answer, the admitted flood still receives every change, and a normal
// subscriber still converges on the true stock within G8's budget.
func TestWSSubscriptionFlood(t *testing.T) {
	testenv.Quiet(t)
	s := newSystem(t)
	p := s.start("a")
	const sku = "WSFLOOD-1"
	s.createProduct(p, sku, 50, 0)
	initial := s.stockOf(sku)
	url := wsEndpoint(p)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	vars := map[string]any{"s": []string{sku}}
	var all []*wsclient.Client // every flood connection, closed at the end
	defer func() {
		for _, c := range all {
			_ = c.CloseNow()
		}
	}()

	// 1. More subscriptions on one connection than its cap, over both
	// protocols: the first 32 are served, each one more is refused with
	// TOO_MANY_SUBSCRIPTIONS and ends, and the connection stays up.
	subsClient := loopbackClient(t, "127.0.0.11")
	var floodWatchers []*stockWatcher
	refusedSubs := 0
	for _, proto := range []string{wsclient.TransportWS, wsclient.LegacyWS} {
		c, err := wsclient.Dial(ctx, url, wsclient.Options{Subprotocol: proto, HTTPClient: subsClient,
			InitPayload: bearer(s.token("flood-subs-"+proto, false))})
		require.NoError(t, err)
		all = append(all, c)
		subs := make([]*wsclient.Subscription, 0, wsSubsPerConn)
		watchers := make([]*stockWatcher, 0, wsSubsPerConn)
		for range wsSubsPerConn {
			sub, err := c.Subscribe(ctx, wsStockDoc, vars)
			require.NoError(t, err)
			subs = append(subs, sub)
			watchers = append(watchers, watchStock(sub))
		}
		for i, w := range watchers {
			_, err := w.waitFor(initial, 10*time.Second)
			require.NoError(t, err, "%s: subscription %d of %d", proto, i+1, wsSubsPerConn)
		}
		for range wsExcess {
			requireSubscriptionRefused(ctx, t, c, vars, "TOO_MANY_SUBSCRIPTIONS")
			refusedSubs++
		}
		require.False(t, isClosed(c.Done()), "%s: refusing a subscription leaves the connection open", proto)

		// A subscription that ends gives its slot back before its
		// "complete" is sent: the next one is admitted at once.
		require.NoError(t, subs[0].Stop(ctx))
		select {
		case <-watchers[0].ended:
		case <-ctx.Done():
			t.Fatalf("%s: a stopped subscription never completed", proto)
		}
		sub, err := c.Subscribe(ctx, wsStockDoc, vars)
		require.NoError(t, err)
		watchers[0] = watchStock(sub)
		_, err = watchers[0].waitFor(initial, 10*time.Second)
		require.NoError(t, err, "%s: a freed slot is reused", proto)
		requireSubscriptionRefused(ctx, t, c, vars, "TOO_MANY_SUBSCRIPTIONS")
		refusedSubs++
		floodWatchers = append(floodWatchers, watchers...)
	}
	// Forty subscriptions sent at once on a fresh connection, their
	// resolvers racing for the slots: exactly 32 are served.
	burstConn, err := wsclient.Dial(ctx, url, wsclient.Options{HTTPClient: subsClient})
	require.NoError(t, err)
	all = append(all, burstConn)
	burst := make([]*wsclient.Subscription, wsSubsPerConn+wsExcess)
	for i := range burst {
		burst[i], err = burstConn.Subscribe(ctx, wsStockDoc, vars)
		require.NoError(t, err)
	}
	burstServed := 0
	for i, sub := range burst {
		m, ok, err := sub.Next(ctx)
		require.NoError(t, err)
		require.True(t, ok, "burst subscription %d got a message", i+1)
		if len(m.Errors) > 0 {
			require.Equal(t, "TOO_MANY_SUBSCRIPTIONS", m.Errors[0].Code(), m.Errors[0].Message)
			refusedSubs++
			continue
		}
		burstServed++
		floodWatchers = append(floodWatchers, watchStock(sub))
	}
	require.Equal(t, wsSubsPerConn, burstServed, "subscriptions served of a burst of %d", len(burst))

	// 2. More connections of one principal than its cap: the excess is
	// closed with 4429 after connection_init, over either protocol, with the
	// token in connection_init or in the upgrade's header, and from another
	// address too (the cap is the principal's, not the address's).
	prinClient, otherClient := loopbackClient(t, "127.0.0.12"), loopbackClient(t, "127.0.0.13")
	prinToken := s.token("flood-principal", false)
	// Thirty-six connections of the principal dialled at once: exactly 32
	// are admitted, the others closed with 4429.
	refused4429 := 0
	prinConns := make([]*wsclient.Client, 0, wsConnsPerPrincipal)
	{
		dialed := make([]*wsclient.Client, wsConnsPerPrincipal+4)
		dialErrs := make([]error, len(dialed))
		var wg sync.WaitGroup
		for i := range dialed {
			wg.Add(1)
			go func() {
				defer wg.Done()
				proto := wsclient.TransportWS
				if i%2 == 1 {
					proto = wsclient.LegacyWS
				}
				dialed[i], dialErrs[i] = wsclient.Dial(ctx, url, wsclient.Options{Subprotocol: proto, HTTPClient: prinClient, InitPayload: bearer(prinToken)})
			}()
		}
		wg.Wait()
		for i, c := range dialed {
			if dialErrs[i] != nil {
				require.Equal(t, websocket.StatusCode(closeTooManyConns), websocket.CloseStatus(dialErrs[i]), "%v", dialErrs[i])
				refused4429++
				continue
			}
			all = append(all, c)
			prinConns = append(prinConns, c)
		}
		require.Len(t, prinConns, wsConnsPerPrincipal, "connections admitted of %d dialled at once", len(dialed))
	}
	for _, o := range []struct {
		name string
		opts wsclient.Options
	}{
		{"graphql-transport-ws, token in connection_init", wsclient.Options{HTTPClient: prinClient, InitPayload: bearer(prinToken)}},
		{"graphql-ws, token in connection_init", wsclient.Options{Subprotocol: wsclient.LegacyWS, HTTPClient: prinClient, InitPayload: bearer(prinToken)}},
		{"graphql-transport-ws, token in the upgrade header", wsclient.Options{HTTPClient: prinClient, Header: http.Header{"Authorization": {"Bearer " + prinToken}}}},
		{"graphql-transport-ws, another address", wsclient.Options{HTTPClient: otherClient, InitPayload: bearer(prinToken)}},
		{"graphql-ws, another address", wsclient.Options{Subprotocol: wsclient.LegacyWS, HTTPClient: otherClient, InitPayload: bearer(prinToken)}},
	} {
		c, err := wsclient.Dial(ctx, url, o.opts)
		if err == nil {
			_ = c.CloseNow()
		}
		require.Error(t, err, o.name)
		require.Equal(t, websocket.StatusCode(closeTooManyConns), websocket.CloseStatus(err), "%s: %v", o.name, err)
		refused4429++
	}
	// A slot comes back when one of the principal's connections ends.
	require.NoError(t, prinConns[0].Close())
	eventually(t, 5*time.Second, "a principal's slot is given back", func() (bool, string) {
		c, err := wsclient.Dial(ctx, url, wsclient.Options{HTTPClient: prinClient, InitPayload: bearer(prinToken)})
		if err != nil {
			refused4429++
			return false, err.Error()
		}
		all = append(all, c)
		return true, ""
	})

	// 3. More connections from one address than its cap: 256 anonymous
	// connections, each with a subscription (the fan-out's load), then the
	// excess gets 429 before the upgrade, websocket or SSE alike, while
	// ordinary requests from that address are still served.
	ipClient := loopbackClient(t, "127.0.0.14")
	ipConns := make([]*wsclient.Client, wsConnsPerIP)
	ipWatchers := make([]*stockWatcher, wsConnsPerIP)
	dialStart := time.Now()
	errs := make(chan error, wsConnsPerIP)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for i := range wsConnsPerIP {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			proto := wsclient.TransportWS
			if i%4 == 3 {
				proto = wsclient.LegacyWS
			}
			c, err := wsclient.Dial(ctx, url, wsclient.Options{Subprotocol: proto, HTTPClient: ipClient})
			if err != nil {
				errs <- fmt.Errorf("address connection %d: %w", i+1, err)
				return
			}
			ipConns[i] = c
			sub, err := c.Subscribe(ctx, wsStockDoc, vars)
			if err != nil {
				errs <- fmt.Errorf("address connection %d: subscribing: %w", i+1, err)
				return
			}
			ipWatchers[i] = watchStock(sub)
		}()
	}
	wg.Wait()
	close(errs)
	for _, c := range ipConns {
		if c != nil {
			all = append(all, c)
		}
	}
	for err := range errs {
		require.NoError(t, err)
	}
	dialTime := time.Since(dialStart)
	for i, w := range ipWatchers {
		_, err := w.waitFor(initial, 10*time.Second)
		require.NoError(t, err, "address connection %d", i+1)
	}
	refused429 := 0
	for i := range 4 {
		conn, resp, err := websocket.Dial(ctx, url, &websocket.DialOptions{
			Subprotocols: []string{[]string{wsclient.TransportWS, wsclient.LegacyWS}[i%2]}, HTTPClient: ipClient})
		if conn != nil {
			_ = conn.CloseNow()
		}
		require.Error(t, err)
		require.NotNil(t, resp, "%v", err)
		require.Equal(t, http.StatusTooManyRequests, resp.StatusCode, "the upgrade over the address cap")
		body, _ := io.ReadAll(resp.Body) // coder/websocket kept the first KiB of it
		_ = resp.Body.Close()
		require.Contains(t, string(body), `"RATE_LIMITED"`, "a typed refusal: %s", body)
		refused429++
	}
	sse := sseRequest(ctx, t, ipClient, p.URL, vars)
	require.Equal(t, http.StatusTooManyRequests, sse.StatusCode, "SSE shares the address cap")
	_ = sse.Body.Close()
	refused429++
	r := post(ctx, ipClient, p.URL, "", `query($s: ID!) { product(sku: $s) { stock { available } } }`, map[string]any{"s": sku})
	require.NoError(t, r.Err)
	require.Equal(t, http.StatusOK, r.Status, "ordinary requests from a capped address are served")
	require.Empty(t, r.Errors)

	// 4. With the whole flood still open: /readyz answers, a normal
	// subscriber converges on every change within the budget, and every
	// admitted flood subscription still receives the changes.
	resp, err := quickClient.Get(p.URL + "/readyz")
	require.NoError(t, err)
	_ = resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	normal, err := wsclient.Dial(ctx, url, wsclient.Options{HTTPClient: loopbackClient(t, "127.0.0.1")})
	require.NoError(t, err)
	defer normal.Close()
	sub, err := normal.Subscribe(ctx, wsStockDoc, vars)
	require.NoError(t, err)
	healthy := watchStock(sub)
	_, err = healthy.waitFor(initial, 10*time.Second)
	require.NoError(t, err)

	stepper := newStockStepper(s, p, sku, initial, 5)
	var lat latencies
	for i := range 10 {
		want, answered := stepper.step(ctx, t)
		at, err := healthy.waitFor(want, 5*time.Second)
		require.NoError(t, err, "step %d", i+1)
		lat.add(at.Sub(answered))
		if i == 4 { // at the peak (5 units held): the flood's subscribers have it too
			for j, w := range append(slices.Clone(floodWatchers), ipWatchers...) {
				_, err := w.waitFor(want, 5*time.Second)
				require.NoError(t, err, "flood subscriber %d", j+1)
			}
		}
	}
	require.Equal(t, initial, stepper.want, "the stepper held and released the same units")
	for j, w := range append(slices.Clone(floodWatchers), ipWatchers...) {
		_, err := w.waitFor(initial, 5*time.Second)
		require.NoError(t, err, "flood subscriber %d", j+1)
		require.Empty(t, w.problems(), "flood subscriber %d", j+1)
	}
	require.Empty(t, healthy.problems())
	require.Less(t, lat.max(), wsLatencyBudget, "G8 under the flood: %s", lat)

	// 5. The flood ends: its slots come back.
	for _, c := range all {
		_ = c.CloseNow()
	}
	eventually(t, 10*time.Second, "the address's slots are given back", func() (bool, string) {
		c, err := wsclient.Dial(ctx, url, wsclient.Options{HTTPClient: ipClient})
		if err != nil {
			return false, err.Error()
		}
		_ = c.Close()
		return true, ""
	})
	require.GreaterOrEqual(t, refusedMetric(t, p, "subscription_limit"), refusedSubs)
	require.GreaterOrEqual(t, refusedMetric(t, p, "principal_limit"), refused4429)
	require.GreaterOrEqual(t, refusedMetric(t, p, "ip_limit"), refused429)

	requireStockUntouched(t, s, sku, initial)
	t.Logf("FIGURES websocket flood: connections=%d (256 from one address in %s) subscriptions=%d refused: subscriptions=%d (TOO_MANY_SUBSCRIPTIONS) principal=%d (4429) address=%d (429) changes=%d healthy_latency %s flood_subscribers_converged=%d violations=0",
		len(all)+1, dialTime.Round(time.Millisecond), len(floodWatchers)+len(ipWatchers)+1, refusedSubs, refused4429, refused429,
		stepper.steps, lat, len(floodWatchers)+len(ipWatchers))
}

// TestWSOperationsInFlight: the cap on one websocket counts every operation
// in flight, not only subscriptions. An anonymous connection holding its 32
// subscriptions is refused a query, a mutation and a burst of queries with
// TOO_MANY_SUBSCRIPTIONS, before any of them runs (the anonymous mutation
// would otherwise be UNAUTHENTICATED), and stays open; once one
// subscription ends, a query is answered.
func TestWSOperationsInFlight(t *testing.T) {
	s := newSystem(t)
	p := s.start("a")
	const sku = "WSOPS-1"
	s.createProduct(p, sku, 5, 0)
	initial := s.stockOf(sku)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	vars := map[string]any{"s": []string{sku}}
	const query = `{ __typename }`
	const mutation = `mutation($sku: ID!) { reserve(input: {sku: $sku, quantity: 1}) { userErrors { code } } }`
	for _, proto := range []string{wsclient.TransportWS, wsclient.LegacyWS} {
		c, err := wsclient.Dial(ctx, wsEndpoint(p), wsclient.Options{Subprotocol: proto, HTTPClient: loopbackClient(t, "127.0.0.41")})
		require.NoError(t, err)
		defer c.CloseNow()
		subs := make([]*wsclient.Subscription, 0, wsSubsPerConn)
		watchers := make([]*stockWatcher, 0, wsSubsPerConn)
		for range wsSubsPerConn {
			sub, err := c.Subscribe(ctx, wsStockDoc, vars)
			require.NoError(t, err)
			subs = append(subs, sub)
			watchers = append(watchers, watchStock(sub))
		}
		for i, w := range watchers {
			_, err := w.waitFor(initial, 10*time.Second)
			require.NoError(t, err, "%s: subscription %d of %d", proto, i+1, wsSubsPerConn)
		}
		requireOperationRefused(ctx, t, c, query, nil, "TOO_MANY_SUBSCRIPTIONS")
		requireOperationRefused(ctx, t, c, mutation, map[string]any{"sku": sku}, "TOO_MANY_SUBSCRIPTIONS")
		burst := make([]*wsclient.Subscription, 40)
		for i := range burst {
			burst[i], err = c.Subscribe(ctx, query, nil)
			require.NoError(t, err)
		}
		for i, sub := range burst {
			m, ok, err := sub.Next(ctx)
			require.NoError(t, err)
			require.True(t, ok, "%s: query %d of the burst got a message", proto, i+1)
			require.Len(t, m.Errors, 1, "%s: query %d of the burst was answered: %s", proto, i+1, m.Data)
			require.Equal(t, "TOO_MANY_SUBSCRIPTIONS", m.Errors[0].Code())
		}
		require.False(t, isClosed(c.Done()), "%s: refusing operations leaves the connection open", proto)

		require.NoError(t, subs[0].Stop(ctx))
		select {
		case <-watchers[0].ended:
		case <-ctx.Done():
			t.Fatalf("%s: a stopped subscription never completed", proto)
		}
		sub, err := c.Subscribe(ctx, query, nil)
		require.NoError(t, err)
		m, ok, err := sub.Next(ctx)
		require.NoError(t, err)
		require.True(t, ok)
		require.Empty(t, m.Errors, "%s: a freed place serves a query", proto)
		require.JSONEq(t, `{"__typename":"Query"}`, string(m.Data))
	}
	requireStockUntouched(t, s, sku, initial)
}

// requireSubscriptionRefused subscribes once more and requires one message
// carrying one error with code, then the end of the stream.
func requireSubscriptionRefused(ctx context.Context, t *testing.T, c *wsclient.Client, vars map[string]any, code string) {
	t.Helper()
	requireOperationRefused(ctx, t, c, wsStockDoc, vars, code)
}

// requireOperationRefused sends doc as an operation and requires one
// message carrying one error with code, then the end of the stream.
func requireOperationRefused(ctx context.Context, t *testing.T, c *wsclient.Client, doc string, vars map[string]any, code string) {
	t.Helper()
	sub, err := c.Subscribe(ctx, doc, vars)
	require.NoError(t, err)
	m, ok, err := sub.Next(ctx)
	require.NoError(t, err)
	require.True(t, ok, "the refused operation got a message")
	require.Len(t, m.Errors, 1, "%s", m.Data)
	require.Equal(t, code, m.Errors[0].Code(), m.Errors[0].Message)
	_, ok, err = sub.Next(ctx)
	require.NoError(t, err)
	require.False(t, ok, "the refused operation ends")
}

// requireStockUntouched checks that the abuse changed nothing: the stock
// is back where it was, nothing was sold, no hold is left in the ledger.
func requireStockUntouched(t *testing.T, s *system, sku string, initial stock) {
	t.Helper()
	require.Equal(t, initial, s.stockOf(sku))
	require.Equal(t, initial.Total, s.scalar(`SELECT total FROM products WHERE sku = $1`, sku))
	require.Zero(t, s.scalar(`SELECT count(*)::int FROM sales`))
	eventually(t, 10*time.Second, "the write-behind drained", func() (bool, string) {
		n := s.scalar(`SELECT count(*)::int FROM reservations WHERE status = 'HELD'`)
		return n == 0, fmt.Sprintf("%d HELD", n)
	})
}

func wsEndpoint(p *proc) string { return "ws" + strings.TrimPrefix(p.URL, "http") + "/graphql" }

func bearer(token string) map[string]any { return map[string]any{"Authorization": "Bearer " + token} }

// loopbackClient returns an HTTP client whose connections leave from the
// loopback address ip: to the server, a client of its own.
func loopbackClient(t *testing.T, ip string) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 5 * time.Second}
	tr := &http.Transport{DialContext: d.DialContext, MaxIdleConnsPerHost: 4}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// sseRequest opens a GraphQL-over-SSE subscription.
func sseRequest(ctx context.Context, t *testing.T, client *http.Client, base string, vars map[string]any) *http.Response {
	t.Helper()
	body := mustJSON(map[string]any{"query": wsStockDoc, "variables": vars})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/graphql", strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	resp, err := client.Do(req)
	require.NoError(t, err)
	return resp
}

// refusedMetric reads dropline_graphql_stream_refused_total{reason} from /metrics.
func refusedMetric(t *testing.T, p *proc, reason string) int {
	t.Helper()
	resp, err := quickClient.Get(p.URL + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	prefix := `dropline_graphql_stream_refused_total{reason="` + reason + `"} `
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), prefix); ok {
			f, err := strconv.ParseFloat(v, 64)
			require.NoError(t, err)
			return int(f)
		}
	}
	require.NoError(t, sc.Err())
	return 0
}
