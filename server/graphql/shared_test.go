package graphql_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/internal/wsclient"
	"github.com/dropline/dropline/live"
	"github.com/dropline/dropline/server/graphql"
)

// sharedEnv serves one engine and hub twice: with shared subscriptions (the
// handler the server mounts) and with every subscription executed on its
// own, as gqlgen alone does.
type sharedEnv struct {
	*liveEnv
	unshared *httptest.Server
}

func setupShared(t *testing.T) *sharedEnv {
	t.Helper()
	var cfg graphql.Config
	le := setupLive(t, live.HubConfig{}, func(c *graphql.Config) { cfg = *c })
	cfg.Registerer = nil
	u := httptest.NewServer(graphql.NewHandlerUnshared(cfg))
	t.Cleanup(u.Close)
	return &sharedEnv{liveEnv: le, unshared: u}
}

// rawSSE subscribes over SSE and returns the first n "data:" lines, bytes
// as sent.
func rawSSE(t *testing.T, url, query string, vars map[string]any, n int) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	body, _ := json.Marshal(map[string]any{"query": query, "variables": vars})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var out []string
	sc := bufio.NewScanner(resp.Body)
	for len(out) < n && sc.Scan() {
		if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			out = append(out, data)
		}
	}
	require.Len(t, out, n, "stream ended early: %v", sc.Err())
	return out
}

// rawWS subscribes over a websocket with subprotocol proto and returns the
// first n data messages ("next", or "data" in the legacy protocol) and
// "error" messages, bytes as sent, with the subscription id blanked.
func rawWS(t *testing.T, url, proto, query string, vars map[string]any, n int) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, resp, err := websocket.Dial(ctx, url, &websocket.DialOptions{Subprotocols: []string{proto}})
	require.NoError(t, err)
	if resp.Body != nil {
		_ = resp.Body.Close()
	}
	defer c.CloseNow()
	write := func(v any) {
		b, _ := json.Marshal(v)
		require.NoError(t, c.Write(ctx, websocket.MessageText, b))
	}
	write(map[string]any{"type": "connection_init"})
	start := "subscribe"
	if proto == wsclient.LegacyWS {
		start = "start"
	}
	write(map[string]any{"type": start, "id": "42", "payload": map[string]any{"query": query, "variables": vars}})
	var out []string
	for len(out) < n {
		_, msg, err := c.Read(ctx)
		require.NoError(t, err)
		var m struct{ Type string }
		require.NoError(t, json.Unmarshal(msg, &m))
		switch m.Type {
		case "next", "data", "error":
			out = append(out, string(msg))
		}
	}
	return out
}

// TestSharedSubscriptionsAnswerLikeGqlgen: whatever the document does with
// aliases, __typename, fragments, directives and field order, a shared
// subscription sends byte for byte what gqlgen sends for that document on
// its own, on SSE and on both websocket protocols, values and errors.
func TestSharedSubscriptionsAnswerLikeGqlgen(t *testing.T) {
	t.Parallel()
	e := setupShared(t)
	e.CreateProduct(t, map[string]any{"sku": "SAME-1", "stock": 7})
	e.CreateProduct(t, map[string]any{"sku": "SAME-2", "stock": 3})
	one := map[string]any{"s": []string{"SAME-1"}}
	docs := []struct {
		name  string
		query string
		vars  map[string]any
		n     int
	}{
		{"plain", `subscription($s: [ID!]!) { stockChanged(skus: $s) { id sku available held sold total updatedAt } }`, one, 1},
		{"aliases and __typename, reordered", `subscription Watch($s: [ID!]!) { live: stockChanged(skus: $s) { __typename total left: available sku id t2: __typename } }`, one, 1},
		{"fragments", `subscription($s: [ID!]!) { stockChanged(skus: $s) { ...F ... on Stock { held id } } } fragment F on Stock { sold sku }`, one, 1},
		{"include true", `subscription($s: [ID!]!, $t: Boolean!) { stockChanged(skus: $s) { sku available @include(if: $t) held @skip(if: $t) } }`,
			map[string]any{"s": []string{"SAME-1"}, "t": true}, 1},
		{"include false", `subscription($s: [ID!]!, $t: Boolean!) { stockChanged(skus: $s) { sku available @include(if: $t) held @skip(if: $t) } }`,
			map[string]any{"s": []string{"SAME-1"}, "t": false}, 1},
		{"two SKUs", `subscription($s: [ID!]!) { stockChanged(skus: $s) { sku available } }`, map[string]any{"s": []string{"SAME-1", "SAME-2"}}, 2},
		{"unknown SKU", `subscription($s: [ID!]!) { stockChanged(skus: $s) { sku } }`, map[string]any{"s": []string{"NOPE-404"}}, 1},
		{"invalid SKU", `subscription($s: [ID!]!) { stockChanged(skus: $s) { sku } }`, map[string]any{"s": []string{"bad sku!"}}, 1},
	}
	unsharedWS := "ws" + strings.TrimPrefix(e.unshared.URL, "http")
	for _, d := range docs {
		want := rawSSE(t, e.unshared.URL, d.query, d.vars, d.n)
		got := rawSSE(t, e.srv.URL, d.query, d.vars, d.n)
		slices.Sort(want)
		slices.Sort(got)
		require.Equal(t, want, got, "%s over SSE", d.name)
		if d.name == "aliases and __typename, reordered" {
			require.Contains(t, got[0], `{"data":{"live":{"__typename":"Stock","total":7,"left":7,"sku":"SAME-1","id":`)
		}
		for _, proto := range []string{wsclient.TransportWS, wsclient.LegacyWS} {
			want := rawWS(t, unsharedWS, proto, d.query, d.vars, d.n)
			got := rawWS(t, e.wsURL, proto, d.query, d.vars, d.n)
			slices.Sort(want)
			slices.Sort(got)
			require.Equal(t, want, got, "%s over %s", d.name, proto)
		}
	}
}

// TestIdenticalSubscriptionsExecuteOnce: 30 websocket and 10 SSE clients of
// one document form one group, executed once per change however many
// members it has; another document is another group; every member gets the
// change, and when they leave nothing is left.
func TestIdenticalSubscriptionsExecuteOnce(t *testing.T) {
	t.Parallel()
	e := setupShared(t)
	e.CreateProduct(t, map[string]any{"sku": "ONCE-1", "stock": 50})
	vars := map[string]any{"s": []string{"ONCE-1"}}
	doc := `subscription($s: [ID!]!) { stockChanged(skus: $s) { sku available } }`
	groups := func() float64 { return metricValue(t, e, "dropline_graphql_shared_subscriptions") }
	members := func() float64 { return metricValue(t, e, "dropline_graphql_shared_subscription_members") }
	activeG := mustGauge(t, e.reg, "dropline_graphql_subscriptions_active", "stockChanged")
	active := func() float64 { return testutil.ToFloat64(activeG) }

	var subs []*wsclient.Subscription
	var clients []*wsclient.Client
	for range 30 {
		c := e.dial(t, wsclient.Options{})
		clients = append(clients, c)
		subs = append(subs, subscribe(t, c, doc, vars))
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sse := make(chan int, 100)
	for range 10 {
		body, _ := json.Marshal(map[string]any{"query": doc, "variables": vars})
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.srv.URL, bytes.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "text/event-stream")
		resp, err := http.DefaultClient.Do(req) //nolint:bodyclose // closed by the reader when the context ends
		require.NoError(t, err)
		go func() {
			defer resp.Body.Close()
			sc := bufio.NewScanner(resp.Body)
			for sc.Scan() {
				if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
					var r struct {
						Data struct{ StockChanged stock } `json:"data"`
					}
					if json.Unmarshal([]byte(data), &r) == nil {
						sse <- r.Data.StockChanged.Available
					}
				}
			}
		}()
	}
	for _, s := range subs {
		m, ok := next(t, s, 5*time.Second)
		require.True(t, ok)
		require.Equal(t, 50, stockPayload(t, m).Available)
	}
	for range 10 {
		require.Equal(t, 50, <-sse)
	}
	require.Equal(t, 1.0, groups(), "one group for one document and its variables")
	require.Equal(t, 40.0, members())
	require.Equal(t, 40.0, active(), "every member counts as an active subscription")

	oc := e.dial(t, wsclient.Options{})
	clients = append(clients, oc)
	other := subscribe(t, oc, `subscription($s: [ID!]!) { stockChanged(skus: $s) { available sku } }`, vars)
	_, ok := next(t, other, 5*time.Second)
	require.True(t, ok)
	require.Equal(t, 2.0, groups(), "another document is another group")

	execs := metricValue(t, e, "dropline_graphql_shared_executions_total")
	require.Empty(t, e.Reserve(t, e.Token(t, "once-buyer", false), map[string]any{"sku": "ONCE-1", "quantity": 1}).UserErrors)
	for _, s := range subs {
		m, ok := next(t, s, 5*time.Second)
		require.True(t, ok)
		require.Equal(t, 49, stockPayload(t, m).Available)
	}
	for range 10 {
		require.Equal(t, 49, <-sse)
	}
	_, ok = next(t, other, 5*time.Second)
	require.True(t, ok)
	require.Equal(t, execs+2, metricValue(t, e, "dropline_graphql_shared_executions_total"),
		"one execution per group for the change, not one per member")

	cancel()
	for _, c := range clients {
		_ = c.Close()
	}
	require.Eventually(t, func() bool {
		return groups() == 0 && members() == 0 && active() == 0
	}, 5*time.Second, 20*time.Millisecond, "groups %v, members %v, active %v",
		groups(), members(), active())
}

// metricValue reads an unlabelled gauge or counter.
func metricValue(t *testing.T, e *sharedEnv, name string) float64 {
	t.Helper()
	mfs, err := e.reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == name {
			m := mf.GetMetric()[0]
			if m.GetCounter() != nil {
				return m.GetCounter().GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	require.Fail(t, fmt.Sprintf("no metric %s", name))
	return 0
}
