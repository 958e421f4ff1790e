package graphql_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/internal/testenv"
	"github.com/dropline/dropline/live"
	"github.com/dropline/dropline/server/graphql"
)

// sseRaw is an SSE stream read off its socket: no goroutine of its own.
type sseRaw struct {
	conn net.Conn
	resp *http.Response
	body *bufio.Reader
}

// dialSSE posts a subscription over a socket of its own and reads the
// response's head.
func dialSSE(t *testing.T, srvURL, authz, query string, vars map[string]any) *sseRaw {
	t.Helper()
	return dialSSEWith(t, &net.Dialer{}, srvURL, authz, query, vars)
}

func dialSSEWith(t *testing.T, d *net.Dialer, srvURL, authz, query string, vars map[string]any) *sseRaw {
	t.Helper()
	u, err := url.Parse(srvURL)
	require.NoError(t, err)
	conn, err := d.Dial("tcp", u.Host)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	require.NoError(t, conn.SetDeadline(time.Now().Add(20*time.Second)))
	body, err := json.Marshal(map[string]any{"query": query, "variables": vars})
	require.NoError(t, err)
	head := "POST / HTTP/1.1\r\nHost: " + u.Host + "\r\nAccept: text/event-stream\r\nContent-Type: application/json\r\n"
	if authz != "" {
		head += "Authorization: " + authz + "\r\n"
	}
	_, err = fmt.Fprintf(conn, "%sContent-Length: %d\r\n\r\n%s", head, len(body), body)
	require.NoError(t, err)
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = resp.Body.Close() })
	return &sseRaw{conn: conn, resp: resp, body: bufio.NewReader(resp.Body)}
}

// event reads the next event (or comment), blank line included.
func (s *sseRaw) event(t *testing.T) string {
	t.Helper()
	var ev strings.Builder
	for {
		line, err := s.body.ReadString('\n')
		require.NoError(t, err, "after %q", ev.String())
		ev.WriteString(line)
		if line == "\n" {
			return ev.String()
		}
	}
}

// TestSSEAnswersLikeGqlgen: a shared subscription over SSE, served on the
// shared writers once net/http has handed over the connection, answers
// what gqlgen's SSE transport answers for the subscription executed on its
// own: status, headers (but Connection: the stream's connection closes
// after it) and the body byte for byte, values, errors and the complete
// that ends a stream whose token expired.
func TestSSEAnswersLikeGqlgen(t *testing.T) {
	t.Parallel()
	e := setupShared(t)
	e.CreateProduct(t, map[string]any{"sku": "SSEQ-1", "stock": 7})
	docs := []struct {
		name  string
		query string
		vars  map[string]any
	}{
		{"plain", `subscription($s: [ID!]!) { stockChanged(skus: $s) { id sku available held sold total updatedAt } }`,
			map[string]any{"s": []string{"SSEQ-1"}}},
		{"aliases", `subscription Watch($s: [ID!]!) { live: stockChanged(skus: $s) { __typename left: available sku } }`,
			map[string]any{"s": []string{"SSEQ-1"}}},
		{"invalid SKU", `subscription($s: [ID!]!) { stockChanged(skus: $s) { sku } }`,
			map[string]any{"s": []string{"bad sku!"}}},
	}
	for _, d := range docs {
		read := func(srvURL string) (http.Response, string) {
			tok, err := e.Issuer.Mint("sse-"+strings.ReplaceAll(d.name, " ", "-"), false, 2*time.Second)
			require.NoError(t, err)
			s := dialSSE(t, srvURL, "Bearer "+tok, d.query, d.vars)
			b, err := io.ReadAll(s.resp.Body)
			require.NoError(t, err, d.name)
			require.NoError(t, s.resp.Body.Close())
			return *s.resp, string(b) // the head only: the body is read
		}
		wantResp, want := read(e.unshared.URL)
		gotResp, got := read(e.srv.URL)
		require.Equal(t, want, got, d.name)
		require.True(t, strings.HasPrefix(got, ":\n\nevent: next\ndata: {"), "%s: %q", d.name, got)
		require.True(t, strings.HasSuffix(got, "\n\nevent: complete\n\n"), "%s: %q", d.name, got)
		require.Equal(t, wantResp.StatusCode, gotResp.StatusCode)
		require.Equal(t, wantResp.TransferEncoding, gotResp.TransferEncoding)
		require.Equal(t, "keep-alive", wantResp.Header.Get("Connection"))
		require.True(t, gotResp.Close, "the stream's connection closes after it")
		for _, h := range []http.Header{wantResp.Header, gotResp.Header} {
			h.Del("Date")
			h.Del("Connection")
			h.Del("X-Request-Id")
		}
		require.Equal(t, wantResp.Header, gotResp.Header, d.name)
	}
}

// TestIdleSSESubscribersHoldOneSmallGoroutineEach: an idle SSE subscriber
// of a shared subscription costs the server one goroutine, a reader waiting
// for the client to go, on a stack of a few KiB: the handler returns once
// the stream is taken from net/http, so net/http's goroutine of the
// connection (its stack grown by the whole handler chain), its reader and
// its buffers are let go, and the writes and keep-alives are shared. The
// clients are raw sockets, so every goroutine counted is the server's.
func TestIdleSSESubscribersHoldOneSmallGoroutineEach(t *testing.T) {
	e := setupLive(t, live.HubConfig{}, func(c *graphql.Config) {
		c.Streams.ConnsPerIP = 1000
		c.Streams.PingInterval = 200 * time.Millisecond
	})
	e.CreateProduct(t, map[string]any{"sku": "IDLE-SSE", "stock": 5})
	const n = 200
	vars := map[string]any{"s": []string{"IDLE-SSE"}}
	var ms runtime.MemStats
	settle := func() (goroutines int, stack uint64) {
		runtime.GC()
		runtime.GC() // the second shrinks the stacks the first found mostly unused
		runtime.ReadMemStats(&ms)
		return runtime.NumGoroutine(), ms.StackInuse
	}
	subscribe := func() *sseRaw {
		s := dialSSE(t, e.srv.URL, "", stockSub, vars)
		require.Equal(t, http.StatusOK, s.resp.StatusCode)
		require.Equal(t, ":\n\n", s.event(t))
		require.Contains(t, s.event(t), "event: next\ndata: ")
		return s
	}
	warm := subscribe()
	before, stackBefore := settle()
	for range n {
		subscribe()
	}
	after, stackAfter := settle()
	perStack := (float64(stackAfter) - float64(stackBefore)) / n
	t.Logf("%d idle SSE subscribers: goroutines %d -> %d (%.2f each), stacks %.0f bytes each",
		n, before, after, float64(after-before)/n, perStack)
	require.LessOrEqual(t, after-before, n+4, "more than one goroutine per idle SSE subscriber")
	all := make([]byte, 32<<20)
	all = all[:runtime.Stack(all, true)]
	serving := strings.Count(string(all), "net/http.(*conn).serve(")
	require.LessOrEqual(t, serving, 4, "idle SSE streams still held by net/http's connection goroutines")
	stackLimit := 4096.0 // the handler's goroutine kept 16 KiB
	if raceEnabled {
		stackLimit *= 2 // the race detector doubles what every stack needs
	}
	require.LessOrEqual(t, perStack, stackLimit, "the goroutine an idle SSE stream keeps has a larger stack than it needs")
	// The shared ticker keeps the streams alive.
	require.Equal(t, ": ping\n\n", warm.event(t))
}

// TestStalledSSEReaderIsDropped: an SSE client that stops reading while its
// stream is busy is disconnected after WriteTimeout, and its subscription
// ends with it.
func TestStalledSSEReaderIsDropped(t *testing.T) {
	testenv.Quiet(t)
	e := setupLive(t, live.HubConfig{Interval: 10 * time.Millisecond}, func(c *graphql.Config) {
		c.Streams.WriteTimeout = 300 * time.Millisecond
	})
	skus := make([]string, 10)
	for i := range skus {
		skus[i] = fmt.Sprintf("SSESTALL-%d", i)
		e.CreateProduct(t, map[string]any{"sku": skus[i], "stock": 1000})
	}
	// A tiny receive buffer, fat payloads (800 aliases of id, about 25 KB
	// an event), and nothing read after the response's head.
	dialer := smallReceiveBuffer()
	s := dialSSEWith(t, dialer, e.srv.URL, "", `subscription($s: [ID!]!) { stockChanged(skus: $s) { `+fatSelection()+` } }`,
		map[string]any{"s": skus})
	require.Equal(t, http.StatusOK, s.resp.StatusCode)
	conns := mustGauge(t, e.reg, "dropline_graphql_stream_connections", "sse")
	active := mustGauge(t, e.reg, "dropline_graphql_subscriptions_active", "stockChanged")
	require.Equal(t, 1.0, testutil.ToFloat64(conns))

	stopLoad := churnStock(context.Background(), e, skus, "sse-load-")
	dropped := false
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline) && !dropped; time.Sleep(20 * time.Millisecond) {
		dropped = testutil.ToFloat64(conns) == 0
	}
	stopLoad()
	require.True(t, dropped, "the stalled SSE client was not dropped")
	require.Eventually(t, func() bool { return testutil.ToFloat64(active) == 0 }, 5*time.Second, 10*time.Millisecond,
		"the stalled client's subscription did not end")
}

// TestSSEStreamHoldsItsSlotsUntilTheClientGoes: a taken-over SSE stream,
// whose handler has returned, still holds its client address's and its
// principal's slots, and gives them back as soon as the client closes its
// connection, its subscription ended with it.
func TestSSEStreamHoldsItsSlotsUntilTheClientGoes(t *testing.T) {
	t.Parallel()
	e := setupLive(t, live.HubConfig{}, func(c *graphql.Config) {
		c.Streams.ConnsPerIP = 2
		c.Streams.ConnsPerPrincipal = 1
	})
	e.CreateProduct(t, map[string]any{"sku": "SSE-SLOTS", "stock": 5})
	vars := map[string]any{"s": []string{"SSE-SLOTS"}}
	alice := e.Token(t, "alice", false)
	open := func(authz string) *sseRaw {
		s := dialSSE(t, e.srv.URL, authz, stockSub, vars)
		if s.resp.StatusCode == http.StatusOK {
			require.Equal(t, ":\n\n", s.event(t))
			require.Contains(t, s.event(t), "event: next\ndata: ")
		}
		return s
	}
	conns := mustGauge(t, e.reg, "dropline_graphql_stream_connections", "sse")
	active := mustGauge(t, e.reg, "dropline_graphql_subscriptions_active", "stockChanged")

	first := open(alice)
	require.Equal(t, http.StatusOK, first.resp.StatusCode)
	require.Equal(t, http.StatusTooManyRequests, open(alice).resp.StatusCode, "the principal's slot is held")
	anon := open("")
	require.Equal(t, http.StatusOK, anon.resp.StatusCode)
	require.Equal(t, http.StatusTooManyRequests, open("").resp.StatusCode, "the address's slots are held")
	require.Equal(t, 2.0, testutil.ToFloat64(conns))
	require.Equal(t, 2.0, testutil.ToFloat64(active))

	require.NoError(t, first.conn.Close())
	require.Eventually(t, func() bool { return testutil.ToFloat64(conns) == 1 && testutil.ToFloat64(active) == 1 },
		5*time.Second, 10*time.Millisecond, "the closed stream was not released")
	again := open(alice)
	require.Equal(t, http.StatusOK, again.resp.StatusCode, "the principal's slot was given back")

	require.NoError(t, again.conn.Close())
	require.NoError(t, anon.conn.Close())
	require.Eventually(t, func() bool { return testutil.ToFloat64(conns) == 0 && testutil.ToFloat64(active) == 0 },
		5*time.Second, 10*time.Millisecond, "the closed streams were not released")
}

// TestServerShutdownEndsSSEStreams: the server's shutdown ends a taken-over
// SSE stream as gqlgen's transport ends one whose request ended: complete,
// then the body's end, and the connection closes.
func TestServerShutdownEndsSSEStreams(t *testing.T) {
	t.Parallel()
	e := setupLive(t, live.HubConfig{})
	e.CreateProduct(t, map[string]any{"sku": "SSE-STOP", "stock": 5})
	srv := httptest.NewServer(e.Handler)
	t.Cleanup(srv.Close)
	s := dialSSE(t, srv.URL, "", stockSub, map[string]any{"s": []string{"SSE-STOP"}})
	require.Equal(t, http.StatusOK, s.resp.StatusCode)
	require.Equal(t, ":\n\n", s.event(t))
	require.Contains(t, s.event(t), "event: next\ndata: ")

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.NoError(t, srv.Config.Shutdown(ctx))
	require.NoError(t, s.conn.SetReadDeadline(time.Now().Add(5*time.Second)))
	require.Equal(t, "event: complete\n\n", s.event(t))
	_, err := s.body.ReadByte()
	require.ErrorIs(t, err, io.EOF, "the stream's body ends")
	require.Eventually(t, func() bool {
		return testutil.ToFloat64(mustGauge(t, e.reg, "dropline_graphql_stream_connections", "sse")) == 0
	}, 5*time.Second, 10*time.Millisecond, "the ended stream was not released")
}
