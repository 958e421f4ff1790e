package faults

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
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

// TestWSSlowloris opens connections that never send connection_init, that
// trickle connection_init a byte at a time, and that send messages over the
// limit (whole, at the limit's edge, fragmented, or announced by a frame
// header), while a healthy subscriber watches a SKU whose stock changes
// without pause. Each attacker is cut off in time with the right close
// code; the healthy subscriber converges on every change within budget.
func TestWSSlowloris(t *testing.T) {
	testenv.Quiet(t)
	s := newSystem(t)
	p := s.start("a")
	const sku = "WSSLOW-1"
	s.createProduct(p, sku, 50, 0)
	initial := s.stockOf(sku)
	url := wsEndpoint(p)
	addr := strings.TrimPrefix(p.URL, "http://")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	vars := map[string]any{"s": []string{sku}}

	normal, err := wsclient.Dial(ctx, url, wsclient.Options{HTTPClient: loopbackClient(t, "127.0.0.1")})
	require.NoError(t, err)
	defer normal.Close()
	sub, err := normal.Subscribe(ctx, wsStockDoc, vars)
	require.NoError(t, err)
	healthy := watchStock(sub)
	_, err = healthy.waitFor(initial, 10*time.Second)
	require.NoError(t, err)

	const attackerIP = "127.0.0.21"
	attackClient := loopbackClient(t, attackerIP)
	type attack struct {
		name string
		// wantCode is the close code; closeWithin bounds when it comes
		// (from the attack's start), closeAfter is its earliest.
		wantCode    int
		closeAfter  time.Duration
		closeWithin time.Duration
		// endWithin, when set, bounds when the server drops the TCP
		// connection of a peer that never answers the close frame.
		endWithin time.Duration
		run       func(ctx context.Context) wsOutcome
	}
	initEarliest, initLatest := wsInitTimeout-300*time.Millisecond, wsInitTimeout+2*time.Second
	// A peer that ignores the close frame is dropped when the close
	// handshake times out (coder/websocket waits 5 s for the peer).
	rawEnd := wsInitTimeout + 5*time.Second + 3*time.Second
	attacks := []attack{}
	for _, proto := range []string{wsclient.TransportWS, wsclient.LegacyWS} {
		attacks = append(attacks,
			attack{name: proto + ": upgraded, never sends connection_init", wantCode: closeProtocolError,
				closeAfter: initEarliest, closeWithin: initLatest,
				run: func(ctx context.Context) wsOutcome { return silentClient(ctx, url, proto, attackClient) }},
			attack{name: proto + ": raw upgrade, never sends a byte, ignores the close frame", wantCode: closeProtocolError,
				closeAfter: initEarliest, closeWithin: initLatest, endWithin: rawEnd,
				run: func(ctx context.Context) wsOutcome { return rawTrickle(ctx, attackerIP, addr, proto, nil) }},
			attack{name: proto + ": raw upgrade, trickles connection_init a byte every 200 ms", wantCode: closeProtocolError,
				closeAfter: initEarliest, closeWithin: initLatest, endWithin: rawEnd,
				run: func(ctx context.Context) wsOutcome {
					init := wsFrame(0x1, true, []byte(`{"type":"connection_init","payload":{"pad":"`+strings.Repeat("x", 200)+`"}}`))
					return rawTrickle(ctx, attackerIP, addr, proto, init)
				}},
			attack{name: proto + ": 64 KiB + 1 before connection_init", wantCode: closeMessageTooBig, closeWithin: 2 * time.Second,
				run: func(ctx context.Context) wsOutcome { return oversizeClient(ctx, url, proto, attackClient, false) }},
			attack{name: proto + ": a 64 KiB subscribe (served), then 64 KiB + 1", wantCode: closeMessageTooBig, closeWithin: 3 * time.Second,
				run: func(ctx context.Context) wsOutcome { return oversizeClient(ctx, url, proto, attackClient, true) }},
			attack{name: proto + ": 80 KB in two fragments after connection_init", wantCode: closeMessageTooBig, closeWithin: 3 * time.Second,
				run: func(ctx context.Context) wsOutcome { return rawOversize(ctx, attackerIP, addr, proto, false) }},
			attack{name: proto + ": a frame announcing 1 GiB after connection_init", wantCode: closeMessageTooBig, closeWithin: 3 * time.Second,
				run: func(ctx context.Context) wsOutcome { return rawOversize(ctx, attackerIP, addr, proto, true) }},
		)
	}

	results := make([]wsOutcome, len(attacks))
	var wg sync.WaitGroup
	attackStart := time.Now()
	for i, a := range attacks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			actx, acancel := context.WithTimeout(ctx, 20*time.Second)
			defer acancel()
			results[i] = a.run(actx)
		}()
	}
	attacking := make(chan struct{})
	go func() { wg.Wait(); close(attacking) }()

	// The stock changes without pause while the attackers run; after each
	// change the healthy subscriber must converge within the budget.
	stepper := newStockStepper(s, p, sku, initial, 5)
	var lat latencies
	for stepper.steps < 400 && !isClosed(attacking) {
		want, answered := stepper.step(ctx, t)
		at, err := healthy.waitFor(want, 5*time.Second)
		require.NoError(t, err, "step %d", stepper.steps)
		lat.add(at.Sub(answered))
	}
	<-attacking
	attackTime := time.Since(attackStart)
	stepper.release(ctx, t)
	_, err = healthy.waitFor(initial, 5*time.Second)
	require.NoError(t, err)
	require.Empty(t, healthy.problems())
	require.False(t, isClosed(normal.Done()), "the healthy connection survived")

	for i, a := range attacks {
		o := results[i]
		t.Logf("%s: %s", a.name, o)
		require.NoError(t, o.err, a.name)
		require.Equal(t, a.wantCode, o.code, "%s: close code (reason %q)", a.name, o.reason)
		require.GreaterOrEqual(t, o.closeAt, a.closeAfter, "%s: closed too early", a.name)
		require.LessOrEqual(t, o.closeAt, a.closeWithin, "%s: closed too late", a.name)
		if a.endWithin > 0 {
			require.True(t, o.ended, "%s: the TCP connection was never dropped", a.name)
			require.LessOrEqual(t, o.endAt, a.endWithin, "%s: dropped too late", a.name)
		}
	}
	require.GreaterOrEqual(t, stepper.steps, 10, "enough changes to judge the latency")
	require.Less(t, lat.max(), wsLatencyBudget, "G8 during the slowloris: %s", lat)

	requireStockUntouched(t, s, sku, initial)
	t.Logf("FIGURES websocket slowloris: attackers=%d cut_off=%d (all with the expected code) for %s; changes=%d healthy_latency %s violations=0",
		len(attacks), len(attacks), attackTime.Round(100*time.Millisecond), stepper.steps, lat)
}

// TestWSTrickleAfterInit trickles a subscribe message after connection_ack,
// a byte a second. Once a message has begun, all of it must arrive within
// the write timeout (DROPLINE_STREAM_WRITE_TIMEOUT; 3 s here, rather than
// the default 10 s the test would wait out), whatever the protocol: a peer
// trickling bytes is cut off, not before the timeout, while an idle
// subscriber (which sends nothing at all) is not.
func TestWSTrickleAfterInit(t *testing.T) {
	testenv.Quiet(t)
	s := newSystem(t)
	const messageTimeout = 3 * time.Second
	s.Env["DROPLINE_STREAM_WRITE_TIMEOUT"] = messageTimeout.String()
	p := s.start("a")
	addr := strings.TrimPrefix(p.URL, "http://")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	var legacy, modern wsOutcome
	sub := func(typ string) []byte {
		return wsFrame(0x1, true, []byte(`{"id":"1","type":"`+typ+`","payload":{"query":"`+strings.Repeat(" ", 400)+`subscription { stockChanged(skus: [\"X\"]) { sku } }"}}`))
	}
	wg.Add(2)
	go func() {
		defer wg.Done()
		modern = rawAfterInit(ctx, "127.0.0.31", addr, wsclient.TransportWS, sub("subscribe"), messageTimeout+15*time.Second)
	}()
	go func() {
		defer wg.Done()
		legacy = rawAfterInit(ctx, "127.0.0.31", addr, wsclient.LegacyWS, sub("start"), messageTimeout+15*time.Second)
	}()
	wg.Wait()
	t.Logf("graphql-transport-ws: %s", modern)
	t.Logf("graphql-ws: %s", legacy)
	for name, o := range map[string]wsOutcome{"graphql-transport-ws": modern, "graphql-ws": legacy} {
		require.NoError(t, o.err, name)
		require.True(t, o.ended, "%s: a peer trickling a message is cut off", name)
		require.GreaterOrEqual(t, o.endAt, messageTimeout-time.Second, "%s: cut off too early", name)
		require.Less(t, o.endAt, messageTimeout+10*time.Second, "%s: cut off too late", name)
	}
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

// stockWatcher follows one stockChanged subscription, keeping the newest
// value and when it arrived.
type stockWatcher struct {
	changed chan struct{} // a value arrived (capacity 1)
	ended   chan struct{} // the subscription's stream ended

	mu   sync.Mutex
	last stock
	at   time.Time
	bad  []string
}

func watchStock(sub *wsclient.Subscription) *stockWatcher {
	w := &stockWatcher{changed: make(chan struct{}, 1), ended: make(chan struct{})}
	go func() {
		defer close(w.ended)
		for m := range sub.C {
			var out struct {
				StockChanged stock `json:"stockChanged"`
			}
			w.mu.Lock()
			switch {
			case len(m.Errors) > 0:
				w.bad = append(w.bad, fmt.Sprintf("errors: %+v", m.Errors))
			case json.Unmarshal(m.Data, &out) != nil:
				w.bad = append(w.bad, fmt.Sprintf("undecodable: %s", m.Data))
			default:
				w.last, w.at = out.StockChanged, m.At
			}
			w.mu.Unlock()
			select {
			case w.changed <- struct{}{}:
			default:
			}
		}
	}()
	return w
}

// waitFor waits until the newest value is want and returns when it arrived.
func (w *stockWatcher) waitFor(want stock, within time.Duration) (time.Time, error) {
	timer := time.NewTimer(within)
	defer timer.Stop()
	for {
		w.mu.Lock()
		last, at := w.last, w.at
		w.mu.Unlock()
		if last == want {
			return at, nil
		}
		select {
		case <-w.changed:
		case <-w.ended:
			w.mu.Lock()
			last, at = w.last, w.at
			w.mu.Unlock()
			if last == want {
				return at, nil
			}
			return time.Time{}, fmt.Errorf("the subscription ended at %+v, want %+v", last, want)
		case <-timer.C:
			return time.Time{}, fmt.Errorf("the newest value after %s is %+v, want %+v", within, last, want)
		}
	}
}

func (w *stockWatcher) problems() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.bad)
}

// stockStepper changes one SKU's stock a unit at a time over GraphQL HTTP:
// it reserves until depth units are held, cancels them one by one, and
// again, so the stock after each step is known and differs from the one
// before. Each reserve comes from a fresh principal, so the mutation rate
// limit never answers in its place.
type stockStepper struct {
	s     *system
	p     *proc
	sku   string
	depth int
	want  stock
	held  [][2]string // reservation token, owner's bearer token
	down  bool
	steps int
}

func newStockStepper(s *system, p *proc, sku string, initial stock, depth int) *stockStepper {
	return &stockStepper{s: s, p: p, sku: sku, depth: depth, want: initial}
}

// step makes one change and returns the stock it leads to and when its
// mutation answered.
func (st *stockStepper) step(ctx context.Context, t *testing.T) (stock, time.Time) {
	t.Helper()
	if len(st.held) == st.depth {
		st.down = true
	} else if len(st.held) == 0 {
		st.down = false
	}
	st.steps++
	if st.down {
		h := st.held[0]
		st.held = st.held[1:]
		st.cancel(ctx, t, h)
		return st.want, time.Now()
	}
	owner := st.s.token(fmt.Sprintf("ws-stepper-%d", st.steps), false)
	r := post(ctx, quickClient, st.p.URL, owner, reserveMutation, map[string]any{"input": map[string]any{"sku": st.sku, "quantity": 1}})
	answered := time.Now()
	require.NoError(t, r.Err)
	require.Equal(t, http.StatusOK, r.Status)
	require.Empty(t, r.Errors)
	var out struct {
		Reserve struct {
			Reservation *struct {
				Token string `json:"token"`
			} `json:"reservation"`
			UserErrors []userError `json:"userErrors"`
		} `json:"reserve"`
	}
	require.NoError(t, json.Unmarshal(r.Data, &out))
	require.Empty(t, out.Reserve.UserErrors)
	require.NotNil(t, out.Reserve.Reservation)
	st.held = append(st.held, [2]string{out.Reserve.Reservation.Token, owner})
	st.want.Available--
	st.want.Held++
	return st.want, answered
}

func (st *stockStepper) cancel(ctx context.Context, t *testing.T, h [2]string) {
	t.Helper()
	r := post(ctx, quickClient, st.p.URL, h[1], cancelMutation, map[string]any{"token": h[0]})
	require.NoError(t, r.Err)
	require.Equal(t, http.StatusOK, r.Status)
	require.Empty(t, r.Errors)
	require.NotContains(t, string(r.Data), `"code"`, "cancel refused: %s", r.Data)
	st.want.Available++
	st.want.Held--
}

// release cancels every hold the stepper still has.
func (st *stockStepper) release(ctx context.Context, t *testing.T) {
	t.Helper()
	for _, h := range st.held {
		st.cancel(ctx, t, h)
	}
	st.held = nil
}

// latencies are the delays between a change's answer and a subscriber's
// value; a value that arrived before the answer counts as zero.
type latencies []time.Duration

func (l *latencies) add(d time.Duration) { *l = append(*l, max(d, 0)) }

func (l latencies) max() time.Duration {
	if len(l) == 0 {
		return 0
	}
	return slices.Max(l)
}

func (l latencies) String() string {
	if len(l) == 0 {
		return "n=0"
	}
	s := slices.Sorted(slices.Values(l))
	return fmt.Sprintf("n=%d p50=%s p99=%s max=%s", len(s), s[len(s)/2].Round(time.Millisecond),
		s[min(len(s)-1, len(s)*99/100)].Round(time.Millisecond), s[len(s)-1].Round(time.Millisecond))
}

// wsOutcome is how the server ended an attacking connection: the close
// frame's code and reason and when it came, and when the TCP connection
// ended (ended false: it did not within the attack's time).
type wsOutcome struct {
	code    int
	reason  string
	closeAt time.Duration
	ended   bool
	endAt   time.Duration
	err     error // the attack could not be carried out
}

func (o wsOutcome) String() string {
	s := fmt.Sprintf("close %d %q after %s", o.code, o.reason, o.closeAt.Round(10*time.Millisecond))
	if o.ended {
		s += fmt.Sprintf(", TCP dropped after %s", o.endAt.Round(10*time.Millisecond))
	}
	if o.err != nil {
		s += fmt.Sprintf(", error: %v", o.err)
	}
	return s
}

// fromCloseError fills the outcome from a coder/websocket read error.
func fromCloseError(err error, start time.Time) wsOutcome {
	o := wsOutcome{closeAt: time.Since(start)}
	var ce websocket.CloseError
	if !errors.As(err, &ce) {
		o.err = fmt.Errorf("no close frame: %w", err)
		return o
	}
	o.code, o.reason = int(ce.Code), ce.Reason
	return o
}

// silentClient upgrades and then only reads.
func silentClient(ctx context.Context, url, proto string, client *http.Client) wsOutcome {
	start := time.Now()
	conn, resp, err := websocket.Dial(ctx, url, &websocket.DialOptions{Subprotocols: []string{proto}, HTTPClient: client})
	if resp != nil && resp.Body != nil {
		_ = resp.Body.Close() // coder/websocket has read what it needs
	}
	if err != nil {
		return wsOutcome{err: err}
	}
	defer conn.CloseNow()
	for {
		if _, _, err := conn.Read(ctx); err != nil {
			return fromCloseError(err, start)
		}
	}
}

// oversizeClient sends one message of wsMessageBytes+1. With afterInit it
// first completes connection_init and subscribes with a message of exactly
// wsMessageBytes, which must be served.
func oversizeClient(ctx context.Context, url, proto string, client *http.Client, afterInit bool) wsOutcome {
	conn, resp, err := websocket.Dial(ctx, url, &websocket.DialOptions{Subprotocols: []string{proto}, HTTPClient: client})
	if resp != nil && resp.Body != nil {
		_ = resp.Body.Close() // coder/websocket has read what it needs
	}
	if err != nil {
		return wsOutcome{err: err}
	}
	defer conn.CloseNow()
	read := func() (map[string]any, error) {
		for {
			_, b, err := conn.Read(ctx)
			if err != nil {
				return nil, err
			}
			var f map[string]any
			if err := json.Unmarshal(b, &f); err != nil {
				return nil, err
			}
			if f["type"] != "ka" && f["type"] != "ping" {
				return f, nil
			}
		}
	}
	if afterInit {
		if err := conn.Write(ctx, websocket.MessageText, []byte(`{"type":"connection_init"}`)); err != nil {
			return wsOutcome{err: err}
		}
		if f, err := read(); err != nil || f["type"] != "connection_ack" {
			return wsOutcome{err: fmt.Errorf("no connection_ack: %v: %w", f, err)}
		}
		typ := "subscribe"
		if proto == wsclient.LegacyWS {
			typ = "start"
		}
		msg := paddedJSON(`{"id":"1","type":"`+typ+`","payload":{"query":"subscription { stockChanged(skus: [\"WSSLOW-1\"]) { sku available } }"}`, wsMessageBytes)
		if err := conn.Write(ctx, websocket.MessageText, msg); err != nil {
			return wsOutcome{err: err}
		}
		f, err := read()
		if err != nil || (f["type"] != "next" && f["type"] != "data") || !strings.Contains(fmt.Sprint(f["payload"]), "WSSLOW-1") {
			return wsOutcome{err: fmt.Errorf("a subscribe of exactly %d bytes was not served: %v: %w", wsMessageBytes, f, err)}
		}
	}
	start := time.Now()
	if err := conn.Write(ctx, websocket.MessageText, paddedJSON(`{"type":"connection_init"`, wsMessageBytes+1)); err != nil {
		return wsOutcome{err: err}
	}
	for {
		if _, _, err := conn.Read(ctx); err != nil {
			return fromCloseError(err, start)
		}
	}
}

// paddedJSON closes the object opened by prefix with spaces and "}" so that
// the message is exactly n bytes.
func paddedJSON(prefix string, n int) []byte {
	b := make([]byte, 0, n)
	b = append(b, prefix...)
	for len(b) < n-1 {
		b = append(b, ' ')
	}
	return append(b, '}')
}

// rawUpgrade opens a TCP connection from ip and completes the websocket
// handshake by hand, so the test owns every byte that follows.
func rawUpgrade(ctx context.Context, ip, addr, proto string) (net.Conn, *bufio.Reader, error) {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 5 * time.Second}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, nil, err
	}
	req := "GET /graphql HTTP/1.1\r\nHost: " + addr + "\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" +
		"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Protocol: " + proto + "\r\n\r\n"
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, req); err != nil {
		_ = c.Close()
		return nil, nil, err
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		_ = c.Close()
		return nil, nil, err
	}
	_ = resp.Body.Close() // a 101 has no body: the connection is ours from here
	if resp.StatusCode != http.StatusSwitchingProtocols {
		_ = c.Close()
		return nil, nil, fmt.Errorf("upgrade answered %d", resp.StatusCode)
	}
	_ = c.SetDeadline(time.Time{})
	return c, br, nil
}

// wsFrameHeader is a masked client frame's header (RFC 6455 §5.2) for a
// payload of n bytes, masked with wsMaskKey.
func wsFrameHeader(opcode byte, fin bool, n uint64) []byte {
	b0 := opcode
	if fin {
		b0 |= 0x80
	}
	h := []byte{b0}
	switch {
	case n < 126:
		h = append(h, 0x80|byte(n))
	case n <= 0xffff:
		h = append(h, 0x80|126, byte(n>>8), byte(n))
	default:
		h = append(h, 0x80|127)
		for shift := 56; shift >= 0; shift -= 8 {
			h = append(h, byte(n>>shift))
		}
	}
	return append(h, wsMaskKey[:]...)
}

var wsMaskKey = [4]byte{0x1f, 0x2e, 0x3d, 0x4c}

// wsMask masks payload bytes that start at offset off of the payload.
func wsMask(payload []byte, off int) []byte {
	out := make([]byte, len(payload))
	for i, b := range payload {
		out[i] = b ^ wsMaskKey[(off+i)%4]
	}
	return out
}

// wsFrame is one whole masked client frame.
func wsFrame(opcode byte, fin bool, payload []byte) []byte {
	return append(wsFrameHeader(opcode, fin, uint64(len(payload))), wsMask(payload, 0)...)
}

// readServerFrame reads one (unmasked) server frame.
func readServerFrame(br *bufio.Reader) (opcode byte, payload []byte, err error) {
	var h [2]byte
	if _, err := io.ReadFull(br, h[:]); err != nil {
		return 0, nil, err
	}
	n := uint64(h[1] & 0x7f)
	switch n {
	case 126:
		var b [2]byte
		if _, err := io.ReadFull(br, b[:]); err != nil {
			return 0, nil, err
		}
		n = uint64(b[0])<<8 | uint64(b[1])
	case 127:
		var b [8]byte
		if _, err := io.ReadFull(br, b[:]); err != nil {
			return 0, nil, err
		}
		n = 0
		for _, x := range b {
			n = n<<8 | uint64(x)
		}
	}
	if n > 1<<20 {
		return 0, nil, fmt.Errorf("a server frame of %d bytes", n)
	}
	payload = make([]byte, n)
	_, err = io.ReadFull(br, payload)
	return h[0] & 0x0f, payload, err
}

// awaitClose reads server frames until the close frame, then until the
// server drops the connection or within has passed since start; it never
// answers the close frame, as a slowloris client would not.
func awaitClose(c net.Conn, br *bufio.Reader, start time.Time, within time.Duration) wsOutcome {
	_ = c.SetReadDeadline(start.Add(within))
	var o wsOutcome
	seen := false
	for {
		op, payload, err := readServerFrame(br)
		if err != nil {
			switch {
			case isTimeout(err) && !seen:
				o.err = fmt.Errorf("no close frame within %s", within)
			case isTimeout(err): // closed, not dropped within the time
			default:
				o.ended, o.endAt = true, time.Since(start)
				if !seen {
					o.err = fmt.Errorf("dropped without a close frame: %w", err)
				}
			}
			return o
		}
		if op == 0x8 && !seen {
			seen, o.closeAt = true, time.Since(start)
			if len(payload) >= 2 {
				o.code, o.reason = int(payload[0])<<8|int(payload[1]), string(payload[2:])
			}
		}
	}
}

// rawTrickle upgrades by hand and then sends trickle one byte every 200 ms
// (nothing when it is nil) until the server drops the connection.
func rawTrickle(ctx context.Context, ip, addr, proto string, trickle []byte) wsOutcome {
	c, br, err := rawUpgrade(ctx, ip, addr, proto)
	if err != nil {
		return wsOutcome{err: err}
	}
	defer c.Close()
	start := time.Now()
	done := make(chan struct{})
	defer close(done)
	if len(trickle) > 0 {
		go func() {
			tick := time.NewTicker(200 * time.Millisecond)
			defer tick.Stop()
			for _, b := range trickle {
				if _, err := c.Write([]byte{b}); err != nil {
					return
				}
				select {
				case <-tick.C:
				case <-done:
					return
				}
			}
		}()
	}
	return awaitClose(c, br, start, 15*time.Second)
}

// rawOversize completes connection_init by hand, then sends 80,000 bytes in
// two fragments of 40,000 or, with announced, a frame header announcing
// 1 GiB followed by 80,000 bytes of it.
func rawOversize(ctx context.Context, ip, addr, proto string, announced bool) wsOutcome {
	c, br, err := rawUpgrade(ctx, ip, addr, proto)
	if err != nil {
		return wsOutcome{err: err}
	}
	defer c.Close()
	if _, err := c.Write(wsFrame(0x1, true, []byte(`{"type":"connection_init"}`))); err != nil {
		return wsOutcome{err: err}
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, payload, err := readServerFrame(br); err != nil || !strings.Contains(string(payload), "connection_ack") {
		return wsOutcome{err: fmt.Errorf("no connection_ack: %q: %w", payload, err)}
	}
	start := time.Now()
	chunk := make([]byte, 40_000)
	for i := range chunk {
		chunk[i] = ' '
	}
	var out []byte
	if announced {
		out = append(wsFrameHeader(0x1, true, 1<<30), wsMask(chunk, 0)...)
		out = append(out, wsMask(chunk, len(chunk))...)
	} else {
		out = append(wsFrame(0x1, false, chunk), wsFrame(0x0, true, chunk)...)
	}
	go func() { _, _ = c.Write(out) }() // the server may stop reading: never block on it
	return awaitClose(c, br, start, 10*time.Second)
}

// rawAfterInit completes connection_init by hand and then trickles msg one
// byte a second, until the server drops the connection or within passes.
func rawAfterInit(ctx context.Context, ip, addr, proto string, msg []byte, within time.Duration) wsOutcome {
	c, br, err := rawUpgrade(ctx, ip, addr, proto)
	if err != nil {
		return wsOutcome{err: err}
	}
	defer c.Close()
	if _, err := c.Write(wsFrame(0x1, true, []byte(`{"type":"connection_init"}`))); err != nil {
		return wsOutcome{err: err}
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, payload, err := readServerFrame(br); err != nil || !strings.Contains(string(payload), "connection_ack") {
		return wsOutcome{err: fmt.Errorf("no connection_ack: %q: %w", payload, err)}
	}
	start := time.Now()
	done := make(chan struct{})
	defer close(done)
	go func() {
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for _, b := range msg {
			if _, err := c.Write([]byte{b}); err != nil {
				return
			}
			select {
			case <-tick.C:
			case <-done:
				return
			}
		}
	}()
	// Pings (and the legacy protocol's keep-alives) are read and never
	// answered; a drop without a close frame is what a read deadline does.
	_ = c.SetReadDeadline(start.Add(within))
	for {
		if _, _, err := readServerFrame(br); err != nil {
			if isTimeout(err) {
				return wsOutcome{}
			}
			return wsOutcome{ended: true, endAt: time.Since(start)}
		}
	}
}
