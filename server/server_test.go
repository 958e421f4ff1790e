package server_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/dropline/dropline/internal/clientaddr"
	"github.com/dropline/dropline/internal/testenv"
	"github.com/dropline/dropline/server"
	"github.com/dropline/dropline/server/playground"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

type bundle struct {
	url    string
	client *http.Client
	logs   *testenv.LogBuffer
	reg    *prometheus.Registry
}

// setup opens a real server.Server on a free loopback port with test
// handlers, and shuts it down when the test ends.
func setup(t *testing.T, mutate func(*server.Config)) bundle {
	t.Helper()
	logs := &testenv.LogBuffer{}
	reg := prometheus.NewRegistry()
	cfg := server.Config{
		Logger:   zerolog.New(logs).Level(zerolog.DebugLevel),
		Registry: reg,
		GraphQL: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			body, err := io.ReadAll(r.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusRequestEntityTooLarge)
				return
			}
			zerolog.Ctx(r.Context()).Info().Msg("graphql handler ran")
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{"data":{"echo":` + strconvQuote(string(body)) + `}}`))
		}),
		Playground: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != "/" && !strings.HasPrefix(r.URL.Path, "/assets/") {
				http.NotFound(w, r)
				return
			}
			_, _ = w.Write([]byte("<html>playground</html>"))
		}),
	}
	if mutate != nil {
		mutate(&cfg)
	}
	cfg.Addr = "127.0.0.1:0"
	s := server.New(cfg)
	require.NoError(t, s.Start(context.Background()))
	client := &http.Client{Transport: &http.Transport{}}
	t.Cleanup(func() {
		client.CloseIdleConnections()
		require.NoError(t, s.Stop(context.Background()))
	})
	return bundle{url: "http://" + s.Addr(), client: client, logs: logs, reg: reg}
}

func strconvQuote(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// reply is what tests look at of a response; the body is already read and
// closed.
type reply struct {
	StatusCode int
	Header     http.Header
}

func (b bundle) do(t *testing.T, method, path string, body io.Reader, headers map[string]string) (reply, string) {
	t.Helper()
	req, err := http.NewRequest(method, b.url+path, body)
	require.NoError(t, err)
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := b.client.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return reply{StatusCode: resp.StatusCode, Header: resp.Header}, string(data)
}

func TestHealthz(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	resp, body := b.do(t, http.MethodGet, "/healthz", nil, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.JSONEq(t, `{"status":"ok"}`, body)
	require.Equal(t, "application/json", resp.Header.Get("Content-Type"))
}

// adminReadyz starts an admin listener with checks and returns the URL of
// its /readyz.
func adminReadyz(t *testing.T, checks []server.Check, timeout time.Duration) string {
	t.Helper()
	a := server.NewAdmin(server.AdminConfig{Addr: "127.0.0.1:0", Checks: checks, CheckTimeout: timeout})
	require.NoError(t, a.Start(context.Background()))
	t.Cleanup(func() { require.NoError(t, a.Stop(context.Background())) })
	return "http://" + a.Addr() + "/readyz"
}

// The public /readyz says whether the process is ready and nothing more:
// the reason of a failure, which names internal addresses, goes to the log
// and to the admin listener's /readyz.
func TestReadyz(t *testing.T) {
	t.Parallel()

	var redisDown sync.Mutex
	down := false
	checks := []server.Check{
		{Name: "postgres", Fn: func(context.Context) error { return nil }},
		{Name: "redis", Fn: func(context.Context) error {
			redisDown.Lock()
			defer redisDown.Unlock()
			if down {
				return errors.New("dial tcp 10.0.3.7:6379: connect: connection refused")
			}
			return nil
		}},
	}
	b := setup(t, func(c *server.Config) {
		c.CheckTimeout = time.Second // the checks answer at once; a stall must not time one out
		c.Checks = checks
	})
	admin := adminReadyz(t, checks, time.Second)

	resp, body := b.do(t, http.MethodGet, "/readyz", nil, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.JSONEq(t, `{"status":"ready"}`, body)

	redisDown.Lock()
	down = true
	redisDown.Unlock()
	resp, body = b.do(t, http.MethodGet, "/readyz", nil, nil)
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	require.JSONEq(t, `{"status":"unavailable"}`, body, "the public port names no reason")
	adminResp, err := http.Get(admin)
	require.NoError(t, err)
	adminBody, err := io.ReadAll(adminResp.Body)
	require.NoError(t, err)
	require.NoError(t, adminResp.Body.Close())
	require.Equal(t, http.StatusServiceUnavailable, adminResp.StatusCode)
	require.JSONEq(t, `{"status":"unavailable","failed":{"redis":"dial tcp 10.0.3.7:6379: connect: connection refused"}}`, string(adminBody))

	// Recovers without a restart: nothing is cached.
	redisDown.Lock()
	down = false
	redisDown.Unlock()
	resp, _ = b.do(t, http.MethodGet, "/readyz", nil, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode)

	// A failing probe is logged at warn, with its reasons, a passing one
	// only at debug.
	var levels []string
	var reasons []any
	for _, l := range b.logs.Lines(t) {
		if l["path"] == "/readyz" {
			levels = append(levels, l["level"].(string))
		}
		if l["message"] == "not ready" {
			reasons = append(reasons, l["failed"])
		}
	}
	require.Equal(t, []string{"debug", "warn", "debug"}, levels)
	require.Equal(t, []any{map[string]any{"redis": "dial tcp 10.0.3.7:6379: connect: connection refused"}}, reasons)
}

func TestReadyzTimeoutAndPanic(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	admin := adminReadyz(t, []server.Check{
		{Name: "respects-ctx", Fn: func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }},
		{Name: "ignores-ctx", Fn: func(context.Context) error { <-release; return nil }},
		{Name: "panics", Fn: func(context.Context) error { panic("boom") }},
	}, time.Second) // room for the panicking check to run on a loaded machine
	start := time.Now()
	resp, err := http.Get(admin)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Less(t, time.Since(start), 5*time.Second, "the checks that hang do not hold the probe")
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	var got struct {
		Status string            `json:"status"`
		Failed map[string]string `json:"failed"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&got))
	require.Equal(t, "unavailable", got.Status)
	require.Contains(t, got.Failed["respects-ctx"], "timed out after 1s")
	require.Contains(t, got.Failed["ignores-ctx"], "timed out after 1s")
	require.Contains(t, got.Failed["panics"], "panicked: boom")
}

func TestRequestIDAndAccessLog(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)

	resp, _ := b.do(t, http.MethodPost, "/graphql?query=secret", strings.NewReader(`{"query":"{x}"}`), map[string]string{
		"Authorization": "Bearer super-secret-token",
		"Content-Type":  "application/json",
	})
	require.Equal(t, http.StatusOK, resp.StatusCode)
	id := resp.Header.Get(server.RequestIDHeader)
	require.Len(t, id, 24)

	resp, _ = b.do(t, http.MethodGet, "/healthz", nil, map[string]string{server.RequestIDHeader: "lb-abc.123:4"})
	require.Equal(t, "lb-abc.123:4", resp.Header.Get(server.RequestIDHeader), "a sane incoming id is kept")

	resp, _ = b.do(t, http.MethodGet, "/healthz", nil, map[string]string{server.RequestIDHeader: "evil\"id with spaces"})
	require.NotEqual(t, "evil\"id with spaces", resp.Header.Get(server.RequestIDHeader))
	require.Len(t, resp.Header.Get(server.RequestIDHeader), 24)

	require.NotContains(t, b.logs.String(), "super-secret-token", "never log Authorization")
	require.NotContains(t, b.logs.String(), "query=secret", "never log query strings")

	var handlerLine, accessLine map[string]any
	for _, l := range b.logs.Lines(t) {
		if l["request_id"] != id {
			continue
		}
		switch l["message"] {
		case "graphql handler ran":
			handlerLine = l
		case "request":
			accessLine = l
		}
	}
	require.NotNil(t, handlerLine, "handlers log through zerolog.Ctx with the request id")
	require.NotNil(t, accessLine)
	require.Equal(t, "POST", accessLine["method"])
	require.Equal(t, "/graphql", accessLine["path"])
	require.EqualValues(t, 200, accessLine["status"])
	require.Greater(t, accessLine["bytes"], float64(0))
	require.Contains(t, accessLine, "duration")
	require.Equal(t, "info", accessLine["level"])
}

func TestPanicRecovery(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *server.Config) {
		c.GraphQL = http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic("resolver exploded") })
	})
	resp, body := b.do(t, http.MethodPost, "/graphql", strings.NewReader("{}"), nil)
	require.Equal(t, http.StatusInternalServerError, resp.StatusCode)
	id := resp.Header.Get(server.RequestIDHeader)
	require.JSONEq(t, `{"error":"internal error","request_id":"`+id+`"}`, body)
	require.NotContains(t, body, "exploded", "panic details stay in the log")

	var found bool
	for _, l := range b.logs.Lines(t) {
		if l["message"] == "handler panic" {
			found = true
			require.Equal(t, id, l["request_id"])
			require.Equal(t, "resolver exploded", l["panic"])
			require.NotEmpty(t, l["stack"])
		}
	}
	require.True(t, found)
	// The server keeps serving.
	resp, _ = b.do(t, http.MethodGet, "/healthz", nil, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode)
}

func TestRoutes(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)

	resp, body := b.do(t, http.MethodGet, "/", nil, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Contains(t, body, "playground")

	resp, _ = b.do(t, http.MethodGet, "/assets/app-ABCDEFGH.js", nil, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, "the playground is the catch-all, its assets are served")

	resp, _ = b.do(t, http.MethodGet, "/nope", nil, nil)
	require.Equal(t, http.StatusNotFound, resp.StatusCode)

	resp, _ = b.do(t, http.MethodPost, "/healthz", nil, nil)
	require.Equal(t, http.StatusNotFound, resp.StatusCode)

	b = setup(t, func(c *server.Config) { c.GraphQL = nil; c.Playground = nil })
	resp, _ = b.do(t, http.MethodPost, "/graphql", nil, nil)
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	resp, body = b.do(t, http.MethodGet, "/", nil, nil)
	require.Equal(t, http.StatusNotFound, resp.StatusCode)
	require.Contains(t, body, `"not found"`)
}

func TestMetrics(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *server.Config) {
		c.Registry.MustRegister(prometheus.NewCounter(prometheus.CounterOpts{Name: "dropline_test_total", Help: "test"}))
	})
	b.do(t, http.MethodGet, "/healthz", nil, nil)
	b.do(t, http.MethodGet, "/some/random/path", nil, nil)
	resp, body := b.do(t, http.MethodGet, "/metrics", nil, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Contains(t, resp.Header.Get("Content-Type"), "text/plain")
	require.Contains(t, body, `dropline_http_requests_total{code="200",method="GET",route="healthz"} 1`)
	require.Contains(t, body, `dropline_http_requests_total{code="404",method="GET",route="other"} 1`)
	require.Contains(t, body, "dropline_test_total 0")
	require.Contains(t, body, "dropline_http_request_duration_seconds_bucket")

	// A second server on the same registry reuses the collectors.
	require.NotPanics(t, func() { server.New(server.Config{Registry: b.reg}) })
}

func TestStartPortZeroAndGracefulStop(t *testing.T) {
	t.Parallel()
	started := make(chan struct{})
	finish := make(chan struct{})
	s := server.New(server.Config{
		Addr: "127.0.0.1:0",
		GraphQL: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			close(started)
			<-finish
			_, _ = w.Write([]byte("done"))
		}),
	})
	require.NoError(t, s.Start(context.Background()))
	addr := s.Addr()
	require.NotEqual(t, "127.0.0.1:0", addr)
	require.Error(t, s.Start(context.Background()), "starting twice is refused")

	type result struct {
		body string
		err  error
	}
	res := make(chan result, 1)
	go func() {
		resp, err := http.Post("http://"+addr+"/graphql", "application/json", strings.NewReader("{}"))
		if err != nil {
			res <- result{err: err}
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		res <- result{string(b), err}
	}()
	<-started

	shutdownDone := make(chan error, 1)
	go func() { shutdownDone <- s.Stop(context.Background()) }()

	// Stop waits for the in-flight request...
	select {
	case <-shutdownDone:
		t.Fatal("shutdown returned before the in-flight request finished")
	case <-time.After(50 * time.Millisecond):
	}
	// ...while refusing new connections.
	require.Eventually(t, func() bool {
		resp, err := http.Get("http://" + addr + "/healthz")
		if err == nil {
			_ = resp.Body.Close()
		}
		return err != nil
	}, 2*time.Second, 10*time.Millisecond)

	close(finish)
	r := <-res
	require.NoError(t, r.err)
	require.Equal(t, "done", r.body)
	require.NoError(t, <-shutdownDone)
	<-s.Done()
	require.NoError(t, s.Err())
	require.NoError(t, s.Stop(context.Background()), "stopping twice does nothing")
}

func TestStopDeadlineCutsStuckRequests(t *testing.T) {
	t.Parallel()
	started := make(chan struct{})
	s := server.New(server.Config{
		Addr: "127.0.0.1:0",
		GraphQL: http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
			close(started)
			<-r.Context().Done() // a handler that only stops when told
		}),
	})
	require.NoError(t, s.Start(context.Background()))
	go func() {
		resp, err := http.Post("http://"+s.Addr()+"/graphql", "application/json", strings.NewReader("{}"))
		if err == nil {
			_ = resp.Body.Close()
		}
	}()
	<-started
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	err := s.Stop(ctx)
	require.ErrorIs(t, err, context.DeadlineExceeded)
}

func TestStartPortInUse(t *testing.T) {
	t.Parallel()
	// A port in use fails at Start with the address in the message.
	s3 := server.New(server.Config{Addr: "127.0.0.1:0"})
	require.NoError(t, s3.Start(context.Background()))
	t.Cleanup(func() { _ = s3.Stop(context.Background()) })
	s2 := server.New(server.Config{Addr: s3.Addr()})
	err := s2.Start(context.Background())
	require.ErrorContains(t, err, "listening on "+s3.Addr())
}

func TestWithRealPlayground(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *server.Config) { c.Playground = playground.Handler() })
	resp, body := b.do(t, http.MethodGet, "/", nil, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Contains(t, strings.ToLower(body), "<html")
	require.NotEmpty(t, resp.Header.Get(server.RequestIDHeader))

	resp, _ = b.do(t, http.MethodGet, "/healthz", nil, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, "the catch-all does not shadow the fixed routes")
	resp, _ = b.do(t, http.MethodPost, "/graphql", strings.NewReader("{}"), nil)
	require.Equal(t, http.StatusOK, resp.StatusCode)
}

// TestAccessLogNamesTheClient logs the client address the server resolved:
// the forwarded one from a trusted proxy, the TCP peer otherwise.
func TestAccessLogNamesTheClient(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		trusted string
		want    string
	}{
		{"127.0.0.1", "2001:db8::5"},
		{"192.0.2.0/24", "127.0.0.1"},
	} {
		p, err := clientaddr.ParsePrefixes([]string{tc.trusted})
		require.NoError(t, err)
		b := setup(t, func(c *server.Config) { c.ClientAddr = clientaddr.NewResolver(p, clientaddr.XForwardedFor) })
		resp, _ := b.do(t, http.MethodGet, "/healthz", nil, map[string]string{"X-Forwarded-For": "198.51.100.1, 2001:db8::5"})
		id := resp.Header.Get(server.RequestIDHeader)
		var line map[string]any
		for _, l := range b.logs.Lines(t) {
			if l["request_id"] == id && l["message"] == "request" {
				line = l
			}
		}
		require.NotNil(t, line)
		require.Equal(t, tc.want, line["client"], "trusting %s", tc.trusted)
		require.Contains(t, line["remote"], "127.0.0.1:")
	}
}

// With LoopbackHostOnly (dev mode) a request for a name that is not
// loopback is refused before anything runs, whatever the path: a page
// that rebinds its own name to 127.0.0.1 reaches the port but not the
// server. Loopback names, with or without a port, are served.
func TestLoopbackHostOnly(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *server.Config) { c.LoopbackHostOnly = true })
	status := func(host, path string) int {
		t.Helper()
		req, err := http.NewRequest(http.MethodGet, b.url+path, nil)
		require.NoError(t, err)
		req.Host = host
		resp, err := b.client.Do(req)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		require.NoError(t, resp.Body.Close())
		return resp.StatusCode
	}
	for _, host := range []string{"localhost", "localhost:8080", "LocalHost:1", "127.0.0.1", "127.0.0.1:8080", "127.3.4.5:9", "[::1]", "[::1]:8080"} {
		require.Equal(t, http.StatusOK, status(host, "/healthz"), host)
	}
	for _, host := range []string{"evil.example", "evil.example:8080", "127.0.0.1.nip.io:8080", "localhost.evil.example", "10.0.0.1:8080", "[::2]:8080", "0.0.0.0:8080"} {
		for _, path := range []string{"/healthz", "/graphql", "/"} {
			require.Equal(t, http.StatusForbidden, status(host, path), "%s%s", host, path)
		}
	}
	// Without the option any Host is served.
	open := setup(t, nil)
	req, err := http.NewRequest(http.MethodGet, open.url+"/healthz", nil)
	require.NoError(t, err)
	req.Host = "evil.example"
	resp, err := open.client.Do(req)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, http.StatusOK, resp.StatusCode)
}
