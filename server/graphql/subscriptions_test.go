package graphql_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/internal/testenv"
	"github.com/dropline/dropline/internal/wsclient"
	"github.com/dropline/dropline/live"
	"github.com/dropline/dropline/resolvers"
	"github.com/dropline/dropline/server/graphql"
)

// liveEnv is env served over a real HTTP server, with a running hub.
type liveEnv struct {
	*env
	srv   *httptest.Server
	wsURL string
	hub   *live.Hub
	reg   *prometheus.Registry
}

func setupLive(t *testing.T, hc live.HubConfig, mods ...func(*graphql.Config)) *liveEnv {
	t.Helper()
	le := &liveEnv{reg: prometheus.NewRegistry()}
	mods = append([]func(*graphql.Config){func(c *graphql.Config) {
		le.hub = live.NewHub(hc, c.Engine, c.Redis, zerolog.Nop(), nil)
		require.NoError(t, le.hub.Start(context.Background()))
		t.Cleanup(func() { require.NoError(t, le.hub.Stop(context.Background())) })
		c.Live = le.hub
		c.Registerer = le.reg
	}}, mods...)
	le.env = setup(t, mods...)
	le.srv = httptest.NewServer(le.Handler)
	t.Cleanup(le.srv.Close)
	le.wsURL = "ws" + strings.TrimPrefix(le.srv.URL, "http")
	return le
}

const stockSub = `subscription($s: [ID!]!) { stockChanged(skus: $s) { ` + stockFields + ` } }`

func (le *liveEnv) dial(t *testing.T, opts wsclient.Options) *wsclient.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := wsclient.Dial(ctx, le.wsURL, opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func subscribe(t *testing.T, c *wsclient.Client, query string, vars map[string]any) *wsclient.Subscription {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := c.Subscribe(ctx, query, vars)
	require.NoError(t, err)
	return s
}

// next waits for the next payload, failing the test after d.
func next(t *testing.T, s *wsclient.Subscription, d time.Duration) (wsclient.Message, bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	m, ok, err := s.Next(ctx)
	require.NoError(t, err, "no message within %s", d)
	return m, ok
}

func stockPayload(t *testing.T, m wsclient.Message) stock {
	t.Helper()
	require.Empty(t, m.Errors)
	var out struct{ StockChanged stock }
	require.NoError(t, json.Unmarshal(m.Data, &out), "%s", m.Data)
	return out.StockChanged
}

// convergeWithin reads s until a value equals the truth of sku, and fails
// when that takes longer than d after the call.
func convergeWithin(t *testing.T, e *env, s *wsclient.Subscription, sku string, d time.Duration) stock {
	t.Helper()
	want := e.Truth(t, sku)
	deadline := time.Now().Add(d)
	for {
		m, ok := next(t, s, time.Until(deadline)+time.Millisecond)
		require.True(t, ok, "stream ended")
		got := stockPayload(t, m)
		if got.Available == want.Available && got.Held == want.Held && got.Sold == want.Sold && got.Total == want.Total {
			require.False(t, m.At.After(deadline), "converged after %s", d)
			return got
		}
	}
}

func TestStockChangedOverWebsocket(t *testing.T) {
	testenv.Quiet(t)
	for _, proto := range []string{wsclient.TransportWS, wsclient.LegacyWS} {
		t.Run(proto, func(t *testing.T) {
			e := setupLive(t, live.HubConfig{})
			sku := "WS-" + strings.ToUpper(strings.ReplaceAll(proto, "-", ""))
			e.CreateProduct(t, map[string]any{"sku": sku, "stock": 10})

			c := e.dial(t, wsclient.Options{Subprotocol: proto}) // anonymous is enough
			s := subscribe(t, c, stockSub, map[string]any{"s": []string{sku}})
			m, ok := next(t, s, 5*time.Second)
			require.True(t, ok)
			first := stockPayload(t, m)
			require.Equal(t, b64("Stock:"+sku), first.ID, "payloads carry the node id")
			require.Equal(t, 10, first.Available)

			buyer := e.Token(t, "buyer", false)
			r := e.Reserve(t, buyer, map[string]any{"sku": sku, "quantity": 3})
			require.Empty(t, r.UserErrors)
			got := convergeWithin(t, e.env, s, sku, 250*time.Millisecond)
			require.Equal(t, 7, got.Available)
			require.Equal(t, 3, got.Held)

			require.Empty(t, e.Cancel(t, buyer, r.Reservation.Token).UserErrors)
			got = convergeWithin(t, e.env, s, sku, 250*time.Millisecond)
			require.Equal(t, 10, got.Available)

			require.NoError(t, s.Stop(context.Background()))
			_, ok = next(t, s, 5*time.Second)
			require.False(t, ok, "stopping completes the subscription")
		})
	}
}

func TestStockChangedOverSSE(t *testing.T) {
	testenv.Quiet(t)
	e := setupLive(t, live.HubConfig{})
	e.CreateProduct(t, map[string]any{"sku": "SSE-1", "stock": 5})

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	body, _ := json.Marshal(map[string]any{"query": stockSub, "variables": map[string]any{"s": []string{"SSE-1"}}})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.srv.URL, bytes.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	resp, err := http.DefaultClient.Do(req) //nolint:bodyclose // closed below; a goroutine scans it
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Contains(t, resp.Header.Get("Content-Type"), "text/event-stream")

	events := make(chan stock, 64)
	go func() {
		defer close(events)
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			data, ok := strings.CutPrefix(sc.Text(), "data: ")
			if !ok {
				continue
			}
			var r struct {
				Data struct{ StockChanged stock } `json:"data"`
			}
			if json.Unmarshal([]byte(data), &r) == nil {
				events <- r.Data.StockChanged
			}
		}
	}()
	recv := func() stock {
		select {
		case s, ok := <-events:
			require.True(t, ok, "stream ended")
			return s
		case <-time.After(5 * time.Second):
			t.Fatal("no event")
		}
		return stock{}
	}
	require.Equal(t, 5, recv().Available)
	require.Empty(t, e.Reserve(t, e.Token(t, "sse-buyer", false), map[string]any{"sku": "SSE-1", "quantity": 2}).UserErrors)
	deadline := time.Now().Add(250 * time.Millisecond)
	for s := recv(); s.Available != 3; s = recv() {
		require.True(t, time.Now().Before(deadline), "not converged within 250ms")
	}
	cancel()
	for range events { //nolint:revive // drain until the reader stops
	}
	require.Eventually(t, func() bool {
		return testutil.ToFloat64(mustGauge(t, e.reg, "dropline_graphql_stream_connections", "sse")) == 0
	}, 5*time.Second, 20*time.Millisecond, "the SSE slot is released when the client goes")
}

func TestReservationChanged(t *testing.T) {
	t.Parallel()
	e := setupLive(t, live.HubConfig{}, func(c *graphql.Config) {
		c.Streams.ReservationRecheck = 200 * time.Millisecond
	})
	e.CreateProduct(t, map[string]any{"sku": "RC-1", "stock": 5})
	owner := e.Token(t, "owner", false)
	r := e.Reserve(t, owner, map[string]any{"sku": "RC-1", "quantity": 1})
	require.Empty(t, r.UserErrors)
	token := r.Reservation.Token
	const doc = `subscription($t: ID!) { reservationChanged(token: $t) { id token status product { stock { available } } } }`
	type rc struct {
		ReservationChanged struct {
			ID, Token, Status string
			Product           struct{ Stock struct{ Available int } }
		}
	}
	decode := func(m wsclient.Message) rc {
		require.Empty(t, m.Errors)
		var out rc
		require.NoError(t, json.Unmarshal(m.Data, &out))
		return out
	}

	t.Run("owner sees HELD, CANCELLED, then completion", func(t *testing.T) {
		c := e.dial(t, wsclient.Options{InitPayload: map[string]any{"Authorization": owner}})
		s := subscribe(t, c, doc, map[string]any{"t": token})
		m, ok := next(t, s, 5*time.Second)
		require.True(t, ok)
		first := decode(m)
		require.Equal(t, "HELD", first.ReservationChanged.Status)
		require.Equal(t, b64("Reservation:"+token), first.ReservationChanged.ID)
		require.Equal(t, 4, first.ReservationChanged.Product.Stock.Available)

		require.Empty(t, e.Cancel(t, owner, token).UserErrors)
		m, ok = next(t, s, 3*time.Second)
		require.True(t, ok)
		last := decode(m)
		require.Equal(t, "CANCELLED", last.ReservationChanged.Status)
		require.Equal(t, 5, last.ReservationChanged.Product.Stock.Available, "each payload reads fresh stock")
		_, ok = next(t, s, 3*time.Second)
		require.False(t, ok, "completes after a final status")
	})

	t.Run("refusals come before streaming", func(t *testing.T) {
		for name, tc := range map[string]struct {
			authz, token, code string
		}{
			"another principal": {e.Token(t, "someone-else", false), token, "FORBIDDEN"},
			"anonymous":         {"", token, "UNAUTHENTICATED"},
			"unknown token":     {owner, "not-a-token", "NOT_FOUND"},
		} {
			t.Run(name, func(t *testing.T) {
				opts := wsclient.Options{}
				if tc.authz != "" {
					opts.InitPayload = map[string]any{"Authorization": tc.authz}
				}
				c := e.dial(t, opts)
				s := subscribe(t, c, doc, map[string]any{"t": tc.token})
				m, ok := next(t, s, 5*time.Second)
				require.True(t, ok)
				require.Len(t, m.Errors, 1)
				require.Equal(t, tc.code, m.Errors[0].Code(), m.Errors[0].Message)
				_, ok = next(t, s, 5*time.Second)
				require.False(t, ok)
			})
		}
	})

	t.Run("an admin may watch", func(t *testing.T) {
		r := e.Reserve(t, owner, map[string]any{"sku": "RC-1", "quantity": 1})
		c := e.dial(t, wsclient.Options{InitPayload: map[string]any{"authToken": strings.TrimPrefix(e.Token(t, "ops", true), "Bearer ")}})
		s := subscribe(t, c, doc, map[string]any{"t": r.Reservation.Token})
		m, ok := next(t, s, 5*time.Second)
		require.True(t, ok)
		require.Equal(t, "HELD", decode(m).ReservationChanged.Status)
	})
}

func TestWebsocketAuth(t *testing.T) {
	t.Parallel()
	e := setupLive(t, live.HubConfig{})
	e.CreateProduct(t, map[string]any{"sku": "AUTH-1", "stock": 5})
	dial := func(opts wsclient.Options) error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		c, err := wsclient.Dial(ctx, e.wsURL, opts)
		if err == nil {
			_ = c.Close()
		}
		return err
	}

	for name, opts := range map[string]wsclient.Options{
		"garbage in connection_init":       {InitPayload: map[string]any{"Authorization": "Bearer nope"}},
		"garbage authToken":                {InitPayload: map[string]any{"authToken": "nope"}},
		"not a bearer scheme":              {InitPayload: map[string]any{"Authorization": "Basic Zm9vOmJhcg=="}},
		"legacy protocol, garbage in init": {Subprotocol: wsclient.LegacyWS, InitPayload: map[string]any{"Authorization": "Bearer nope"}},
	} {
		t.Run(name, func(t *testing.T) {
			err := dial(opts)
			require.Error(t, err)
			require.Equal(t, websocket.StatusCode(graphql.CloseForbidden), websocket.CloseStatus(err), "%v", err)
		})
	}

	t.Run("garbage in the upgrade header is refused before the upgrade", func(t *testing.T) {
		conn, resp, err := websocket.Dial(context.Background(), e.wsURL, &websocket.DialOptions{
			Subprotocols: []string{wsclient.TransportWS},
			HTTPHeader:   http.Header{"Authorization": {"Bearer nope"}},
		})
		if conn != nil {
			_ = conn.CloseNow()
		}
		if resp != nil && resp.Body != nil {
			_ = resp.Body.Close()
		}
		require.Error(t, err)
		require.NotNil(t, resp)
		require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
		require.Contains(t, resp.Header.Get("WWW-Authenticate"), "Bearer")
	})

	t.Run("a good token in the upgrade header", func(t *testing.T) {
		require.NoError(t, dial(wsclient.Options{Header: http.Header{"Authorization": {e.Token(t, "hdr", false)}}}))
	})

	t.Run("the token's expiry ends the connection with 4403", func(t *testing.T) {
		tok, err := e.Issuer.Mint("short-lived", false, 3*time.Second) // outlasts the dial and the first value on a slow machine
		require.NoError(t, err)
		c := e.dial(t, wsclient.Options{InitPayload: map[string]any{"Authorization": "Bearer " + tok}})
		s := subscribe(t, c, stockSub, map[string]any{"s": []string{"AUTH-1"}})
		_, ok := next(t, s, 5*time.Second)
		require.True(t, ok)
		select {
		case <-c.Done():
		case <-time.After(10 * time.Second):
			t.Fatal("connection outlived its token")
		}
		require.Equal(t, websocket.StatusCode(graphql.CloseForbidden), websocket.CloseStatus(c.Err()), "%v", c.Err())
	})

	t.Run("a foreign origin is refused before the upgrade", func(t *testing.T) {
		err := dial(wsclient.Options{Header: http.Header{"Origin": {"https://evil.example"}}})
		require.ErrorContains(t, err, "403")
		require.NoError(t, dial(wsclient.Options{Header: http.Header{"Origin": {"https://shop.example"}}}))
	})
}

func TestWebsocketInitTimeout(t *testing.T) {
	t.Parallel()
	e := setupLive(t, live.HubConfig{}, func(c *graphql.Config) { c.Streams.InitTimeout = 200 * time.Millisecond })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, resp, err := websocket.Dial(ctx, e.wsURL, &websocket.DialOptions{Subprotocols: []string{wsclient.TransportWS}})
	require.NoError(t, err)
	if resp.Body != nil {
		_ = resp.Body.Close()
	}
	defer conn.CloseNow()
	_, _, err = conn.Read(ctx) // never send connection_init
	require.Equal(t, websocket.StatusProtocolError, websocket.CloseStatus(err), "gqlgen closes a silent client with 1002: %v", err)
}

func TestStreamLimits(t *testing.T) {
	t.Parallel()
	e := setupLive(t, live.HubConfig{}, func(c *graphql.Config) {
		c.Streams = graphql.StreamLimits{ConnsPerIP: 3, ConnsPerPrincipal: 1, SubscriptionsPerConn: 2, MessageBytes: 2048}
	})
	e.CreateProduct(t, map[string]any{"sku": "LIM-1", "stock": 5})
	vars := map[string]any{"s": []string{"LIM-1"}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	alice := e.Token(t, "alice", false)
	c1 := e.dial(t, wsclient.Options{InitPayload: map[string]any{"Authorization": alice}})

	t.Run("subscriptions per connection", func(t *testing.T) {
		s1 := subscribe(t, c1, stockSub, vars)
		s2 := subscribe(t, c1, stockSub, vars)
		for _, s := range []*wsclient.Subscription{s1, s2} {
			m, _ := next(t, s, 5*time.Second)
			require.Empty(t, m.Errors)
		}
		s3 := subscribe(t, c1, stockSub, vars)
		m, _ := next(t, s3, 5*time.Second)
		require.Len(t, m.Errors, 1)
		require.Equal(t, resolvers.CodeTooManySubscriptions, m.Errors[0].Code())
		require.NoError(t, s1.Stop(ctx))
		require.Eventually(t, func() bool {
			s4 := subscribe(t, c1, stockSub, vars)
			m, _ := next(t, s4, 5*time.Second)
			return len(m.Errors) == 0
		}, 5*time.Second, 50*time.Millisecond, "a stopped subscription frees its slot")
	})

	t.Run("connections per principal", func(t *testing.T) {
		_, err := wsclient.Dial(ctx, e.wsURL, wsclient.Options{InitPayload: map[string]any{"Authorization": alice}})
		require.Equal(t, websocket.StatusCode(graphql.CloseTooManyConnections), websocket.CloseStatus(err), "%v", err)
	})

	t.Run("message size", func(t *testing.T) {
		c := e.dial(t, wsclient.Options{})
		_, err := c.Subscribe(ctx, stockSub+strings.Repeat(" ", 4096), vars)
		require.NoError(t, err)
		<-c.Done()
		require.Equal(t, websocket.StatusMessageTooBig, websocket.CloseStatus(c.Err()), "%v", c.Err())
	})

	t.Run("connections per address", func(t *testing.T) {
		// c1 is open; wait until the message-size connection is released.
		require.Eventually(t, func() bool {
			return testutil.ToFloat64(mustGauge(t, e.reg, "dropline_graphql_stream_connections", "websocket")) == 1
		}, 5*time.Second, 20*time.Millisecond)
		e.dial(t, wsclient.Options{})
		e.dial(t, wsclient.Options{})
		_, err := wsclient.Dial(ctx, e.wsURL, wsclient.Options{})
		require.ErrorContains(t, err, "429")
	})
}

// mustGauge finds one series of a gauge vector in reg.
func mustGauge(t *testing.T, reg *prometheus.Registry, name, label string) prometheus.Collector {
	t.Helper()
	return gaugeSeries{reg: reg, name: name, label: label}
}

// gaugeSeries reads one labelled value of a gathered metric family.
type gaugeSeries struct {
	reg         *prometheus.Registry
	name, label string
}

func (g gaugeSeries) Describe(chan<- *prometheus.Desc) {}
func (g gaugeSeries) Collect(ch chan<- prometheus.Metric) {
	mfs, _ := g.reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() != g.name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetValue() == g.label {
					ch <- prometheus.MustNewConstMetric(prometheus.NewDesc(g.name, "", nil, nil), prometheus.GaugeValue, m.GetGauge().GetValue())
					return
				}
			}
		}
	}
	ch <- prometheus.MustNewConstMetric(prometheus.NewDesc(g.name, "", nil, nil), prometheus.GaugeValue, 0)
}

// TestReservationChangedOnCartLines watches each line of a cart: both see
// HELD, then COMMITTED when the cart is sold, then complete.
func TestReservationChangedOnCartLines(t *testing.T) {
	t.Parallel()
	e := setupLive(t, live.HubConfig{}, func(c *graphql.Config) {
		c.Streams.ReservationRecheck = 200 * time.Millisecond
	})
	e.CreateProduct(t, map[string]any{"sku": "RCL-A", "stock": 2})
	e.CreateProduct(t, map[string]any{"sku": "RCL-B", "stock": 2})
	owner := e.Token(t, "owner", false)
	var held struct {
		ReserveCart struct {
			Cart struct {
				Token string
				Lines []struct{ Token string }
			}
			UserErrors []any
		}
	}
	e.MustDo(t, owner, `mutation { reserveCart(input: {lines: [{sku: "RCL-A", quantity: 1}, {sku: "RCL-B", quantity: 2}]}) {
		cart { token lines { token } } userErrors { code } } }`, nil, &held)
	require.Empty(t, held.ReserveCart.UserErrors)
	require.Len(t, held.ReserveCart.Cart.Lines, 2)
	const doc = `subscription($t: ID!) { reservationChanged(token: $t) { token status } }`
	type rc struct {
		ReservationChanged struct{ Token, Status string }
	}
	c := e.dial(t, wsclient.Options{InitPayload: map[string]any{"Authorization": owner}})
	var subs []*wsclient.Subscription
	for _, l := range held.ReserveCart.Cart.Lines {
		s := subscribe(t, c, doc, map[string]any{"t": l.Token})
		m, ok := next(t, s, 5*time.Second)
		require.True(t, ok)
		require.Empty(t, m.Errors)
		var out rc
		require.NoError(t, json.Unmarshal(m.Data, &out))
		require.Equal(t, "HELD", out.ReservationChanged.Status)
		subs = append(subs, s)
	}
	var sold struct{ CommitCart struct{ UserErrors []any } }
	e.MustDo(t, owner, `mutation($t: ID!) { commitCart(input: {token: $t}) { userErrors { code } } }`,
		map[string]any{"t": held.ReserveCart.Cart.Token}, &sold)
	require.Empty(t, sold.CommitCart.UserErrors)
	for i, s := range subs {
		m, ok := next(t, s, 3*time.Second)
		require.True(t, ok)
		var out rc
		require.NoError(t, json.Unmarshal(m.Data, &out))
		require.Equal(t, held.ReserveCart.Cart.Lines[i].Token, out.ReservationChanged.Token)
		require.Equal(t, "COMMITTED", out.ReservationChanged.Status)
		_, ok = next(t, s, 3*time.Second)
		require.False(t, ok, "completes after a final status")
	}
}
