package app_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/app"
	"github.com/dropline/dropline/auth"
	"github.com/dropline/dropline/config"
	"github.com/dropline/dropline/db"
	"github.com/dropline/dropline/internal/startstop"
	"github.com/dropline/dropline/internal/testenv"
	"github.com/dropline/dropline/server"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// adminDatabaseURL points at the "postgres" database of the server
// DATABASE_URL names: these tests only need a server that answers, not
// Dropline's schema.
func adminDatabaseURL(t *testing.T) string {
	t.Helper()
	raw := os.Getenv("DATABASE_URL")
	if raw == "" {
		raw = config.DefaultDatabaseURL
	}
	u, err := url.Parse(raw)
	require.NoError(t, err, "DATABASE_URL must be a URL for these tests")
	u.Path = "/postgres"
	return u.String()
}

func redisURL() string {
	if v := os.Getenv("REDIS_URL"); v != "" {
		return v
	}
	return config.DefaultRedisURL
}

// testConfig is a valid config against the real services, on port 0.
func testConfig(t *testing.T) config.Config {
	t.Helper()
	c := config.Default()
	c.Addr = "127.0.0.1:0"
	c.DatabaseURL = adminDatabaseURL(t)
	c.RedisURL = redisURL()
	c.JWTSecret = "app-test-secret-app-test-secret-xx"
	c.KeyPrefix = testenv.Redis(t).Prefix // this test's own keys, deleted when it ends
	c.ShutdownTimeout = 5 * time.Second
	require.NoError(t, c.Validate())
	return c
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

// recorder is a stand-in service that notes it was started and stopped.
type recorder struct {
	mu               *sync.Mutex
	started, stopped *bool
}

func (r *recorder) Start(context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	*r.started = true
	return nil
}

func (r *recorder) Stop(context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	*r.stopped = true
	return nil
}

func TestStartServesAndStops(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)

	var started, stopped bool
	var mu sync.Mutex
	a := app.New(cfg, zerolog.Nop())
	a.Deps = app.Deps{
		PendingMigrations: func(context.Context, *pgxpool.Pool) (int, error) { return 0, nil },
		Build: func(_ context.Context, in app.Infra) (app.Services, error) {
			require.NotNil(t, in.Redis)
			require.NotNil(t, in.Postgres)
			require.NotNil(t, in.SalePool, "the sales have a pool of their own")
			require.Equal(t, int32(db.SaleConns), in.SalePool.Stat().TotalConns(), "its connections are open before the first commit")
			require.NotSame(t, in.Postgres, in.SalePool)
			require.NotNil(t, in.Registry)
			require.NotNil(t, in.Issuer)
			return app.Services{
				// Like graphql.NewHandler, the stand-in verifies tokens with in.Issuer.
				GraphQL: auth.Middleware(in.Issuer, func(w http.ResponseWriter, _ *http.Request, err error) {
					w.WriteHeader(http.StatusUnauthorized)
					_ = json.NewEncoder(w).Encode(map[string]any{"principal": "", "authError": err != nil})
				})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					p, _ := auth.PrincipalFrom(r.Context())
					_ = json.NewEncoder(w).Encode(map[string]any{"principal": p.ID, "authError": false})
				})),
				Checks:  []server.Check{{Name: "scripts", Fn: func(context.Context) error { return nil }}},
				Workers: &recorder{mu: &mu, started: &started, stopped: &stopped},
			}, nil
		},
	}
	require.NoError(t, a.Start(context.Background()))
	base := "http://" + a.Addr()
	require.NotEqual(t, "127.0.0.1:0", a.Addr())

	code, _ := get(t, base+"/healthz")
	require.Equal(t, http.StatusOK, code)
	code, body := get(t, base+"/readyz")
	require.Equal(t, http.StatusOK, code, body)
	require.JSONEq(t, `{"status":"ready"}`, body)
	code, body = get(t, base+"/metrics")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "go_goroutines")
	require.Contains(t, body, "dropline_http_requests_total")
	code, _ = get(t, base+"/")
	require.Equal(t, http.StatusOK, code, "the playground is served")

	// /graphql gets the auth middleware.
	tok, err := a.Issuer().Mint("alice", false, time.Minute)
	require.NoError(t, err)
	post := func(authz string) map[string]any {
		req, err := http.NewRequest(http.MethodPost, base+"/graphql", strings.NewReader(`{}`))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		if authz != "" {
			req.Header.Set("Authorization", authz)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		var m map[string]any
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&m))
		return m
	}
	require.Equal(t, map[string]any{"principal": "alice", "authError": false}, post("Bearer "+tok))
	require.Equal(t, map[string]any{"principal": "", "authError": true}, post("Bearer nope"))
	require.Equal(t, map[string]any{"principal": "", "authError": false}, post(""))

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.NoError(t, a.Stop(ctx))
	require.NoError(t, a.Stop(ctx), "Stop is idempotent")
	mu.Lock()
	require.True(t, started)
	require.True(t, stopped)
	mu.Unlock()
	<-a.Done()
	resp, err := http.Get(base + "/healthz")
	if err == nil {
		_ = resp.Body.Close()
	}
	require.Error(t, err, "the listener is closed")
}

// stream is a stand-in live hub: the GraphQL stand-in below streams until it
// stops, as a subscription over SSE does.
type stream struct {
	startstop.Base
	order *[]string
	mu    *sync.Mutex
}

func (s *stream) Start(ctx context.Context) error {
	s.Go(ctx, func(ctx context.Context) error {
		<-ctx.Done()
		s.mu.Lock()
		*s.order = append(*s.order, "live stopped")
		s.mu.Unlock()
		return nil
	})
	return nil
}

// orderedWorkers notes when it is stopped.
type orderedWorkers struct {
	order *[]string
	mu    *sync.Mutex
}

func (w orderedWorkers) Start(context.Context) error { return nil }
func (w orderedWorkers) Stop(context.Context) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	*w.order = append(*w.order, "workers stopped")
	return nil
}

// Stop ends the live streams before the HTTP server drains, so an open
// stream does not hold the shutdown until its deadline, and stops the
// workers only after the last request has finished.
func TestStopEndsStreamsBeforeTheDrainAndWorkersAfter(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var order []string
	live := &stream{order: &order, mu: &mu}
	streaming := make(chan struct{})
	a := app.New(testConfig(t), zerolog.Nop())
	a.Deps = app.Deps{Build: func(context.Context, app.Infra) (app.Services, error) {
		return app.Services{
			GraphQL: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				w.WriteHeader(http.StatusOK)
				w.(http.Flusher).Flush()
				close(streaming)
				<-live.Done() // the stream lasts as long as the hub
				mu.Lock()
				order = append(order, "stream ended")
				mu.Unlock()
			}),
			Live:    live,
			Workers: orderedWorkers{order: &order, mu: &mu},
		}, nil
	}}
	require.NoError(t, a.Start(context.Background()))
	resp, err := http.Post("http://"+a.Addr()+"/graphql", "application/json", strings.NewReader(`{}`))
	require.NoError(t, err)
	defer resp.Body.Close()
	<-streaming

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	began := time.Now()
	require.NoError(t, a.Stop(ctx))
	require.Less(t, time.Since(began), 5*time.Second, "the open stream held the shutdown")
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []string{"live stopped", "stream ended", "workers stopped"}, order)
}

func TestStartWithoutWiring(t *testing.T) {
	t.Parallel()
	a := app.New(testConfig(t), zerolog.Nop())
	a.Deps = app.Deps{}
	require.NoError(t, a.Start(context.Background()))
	t.Cleanup(func() { _ = a.Stop(context.Background()) })
	resp, err := http.Post("http://"+a.Addr()+"/graphql", "application/json", strings.NewReader(`{}`))
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)

	require.ErrorContains(t, a.Migrate(context.Background()), "not wired")
	require.ErrorContains(t, a.SeedDemo(context.Background()), "not wired")
}

func TestReadyzReportsPendingMigrations(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	cfg.AdminAddr = "127.0.0.1:0"
	a := app.New(cfg, zerolog.Nop())
	a.Deps = app.Deps{PendingMigrations: func(context.Context, *pgxpool.Pool) (int, error) { return 2, nil }}
	require.NoError(t, a.Start(context.Background()))
	t.Cleanup(func() { _ = a.Stop(context.Background()) })
	code, body := get(t, "http://"+a.Addr()+"/readyz")
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.JSONEq(t, `{"status":"unavailable"}`, body)
	code, body = get(t, "http://"+a.AdminAddr()+"/readyz")
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.JSONEq(t, `{"status":"unavailable","failed":{"migrations":"2 migration(s) pending: run `+"`dropline migrate`"+`"}}`, body)
}

func TestMigrateAndSeedCallDeps(t *testing.T) {
	t.Parallel()
	a := app.New(testConfig(t), zerolog.Nop())
	var migrated, seeded bool
	a.Deps = app.Deps{
		Migrate: func(_ context.Context, pool *pgxpool.Pool) error {
			require.NotNil(t, pool)
			migrated = true
			return nil
		},
		SeedDemo: func(_ context.Context, in app.Infra) error {
			require.NotNil(t, in.Redis)
			seeded = true
			return nil
		},
	}
	require.NoError(t, a.Migrate(context.Background()))
	require.NoError(t, a.SeedDemo(context.Background()))
	require.True(t, migrated)
	require.True(t, seeded)
	require.NoError(t, a.Stop(context.Background()))

	b := app.New(testConfig(t), zerolog.Nop())
	b.Deps.Migrate = func(context.Context, *pgxpool.Pool) error { return errors.New("relation exploded") }
	err := b.Migrate(context.Background())
	require.ErrorContains(t, err, "migrating postgres://")
	require.ErrorContains(t, err, "relation exploded")
	require.NoError(t, b.Stop(context.Background()))
}

func TestUnreachableServicesFailWithOneLine(t *testing.T) {
	t.Parallel()
	closedPort := func() string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		addr := ln.Addr().String()
		require.NoError(t, ln.Close())
		return addr
	}

	cfg := testConfig(t)
	cfg.DatabaseURL = "postgres://postgres:hunter2@" + closedPort() + "/dropline?sslmode=disable"
	a := app.New(cfg, zerolog.Nop())
	err := a.Start(context.Background())
	require.Error(t, err)
	msg := err.Error()
	require.True(t, strings.HasPrefix(msg, "cannot reach PostgreSQL at postgres://postgres:xxxxx@127.0.0.1:"), msg)
	require.Contains(t, msg, "connection refused")
	require.Contains(t, msg, `start it with "make services"`)
	require.NotContains(t, msg, "hunter2")
	require.NotContains(t, msg, "\n")

	cfg = testConfig(t)
	cfg.RedisURL = "redis://" + closedPort() + "/0"
	a = app.New(cfg, zerolog.Nop())
	err = a.Start(context.Background())
	require.Error(t, err)
	msg = err.Error()
	require.True(t, strings.HasPrefix(msg, "cannot reach Redis at redis://127.0.0.1:"), msg)
	require.Contains(t, msg, "connection refused")
	require.NotContains(t, msg, "\n")

	cfg = testConfig(t)
	u, err := url.Parse(cfg.DatabaseURL)
	require.NoError(t, err)
	u.Path = "/dropline_app_test_no_such_db"
	cfg.DatabaseURL = u.String()
	err = app.New(cfg, zerolog.Nop()).Start(context.Background())
	require.ErrorContains(t, err, `database "dropline_app_test_no_such_db" does not exist`)
}

func TestPortInUse(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	cfg := testConfig(t)
	cfg.Addr = ln.Addr().String()
	err = app.New(cfg, zerolog.Nop()).Start(context.Background())
	require.ErrorContains(t, err, "cannot listen on DROPLINE_ADDR ("+cfg.Addr+")")
	require.ErrorContains(t, err, "address already in use")
}

// TestReadyzFollowsRedisOutage puts a TCP proxy between the App and Redis
// and cuts it, as if Redis went down: /readyz must say so, and recover by
// itself when Redis is back.
func TestReadyzFollowsRedisOutage(t *testing.T) {
	t.Parallel()
	opts, err := config.Config{RedisURL: redisURL()}.RedisOptions()
	require.NoError(t, err)
	require.Nil(t, opts.Cluster, "this test proxies a single Redis")
	p := testenv.NewProxy(t, opts.Single.Addr)

	cfg := testConfig(t)
	cfg.RedisURL = "redis://" + p.Addr + "/" + strconv.Itoa(opts.Single.DB)
	cfg.AdminAddr = "127.0.0.1:0"
	a := app.New(cfg, zerolog.Nop())
	a.Deps = app.Deps{}
	require.NoError(t, a.Start(context.Background()))
	t.Cleanup(func() { _ = a.Stop(context.Background()) })
	ready := "http://" + a.Addr() + "/readyz"

	code, _ := get(t, ready)
	require.Equal(t, http.StatusOK, code)

	p.Cut()
	code, body := get(t, ready)
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.JSONEq(t, `{"status":"unavailable"}`, body)
	code, body = get(t, "http://"+a.AdminAddr()+"/readyz")
	require.Equal(t, http.StatusServiceUnavailable, code)
	var got struct {
		Status string            `json:"status"`
		Failed map[string]string `json:"failed"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &got))
	require.Equal(t, "unavailable", got.Status)
	require.Contains(t, got.Failed, "redis")
	require.NotContains(t, got.Failed, "postgres")

	p.Restore()
	require.Eventually(t, func() bool {
		code, _ := get(t, ready)
		return code == http.StatusOK
	}, 10*time.Second, 50*time.Millisecond, "readiness recovers without a restart")
}

func TestAdminListenerServesTheProfilerApartFromTheAPI(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	cfg.AdminAddr = "127.0.0.1:0"
	require.NoError(t, cfg.Validate())
	a := app.New(cfg, zerolog.Nop())
	a.Deps = app.Deps{PendingMigrations: func(context.Context, *pgxpool.Pool) (int, error) { return 0, nil }}
	require.NoError(t, a.Start(context.Background()))
	t.Cleanup(func() { _ = a.Stop(context.Background()) })

	admin := a.AdminAddr()
	require.NotEmpty(t, admin)
	require.NotEqual(t, "127.0.0.1:0", admin, "the bound port is reported")
	require.NotEqual(t, a.Addr(), admin)

	code, body := get(t, "http://"+admin+"/debug/pprof/")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "goroutine")
	code, body = get(t, "http://"+admin+"/debug/pprof/goroutine?debug=1")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "goroutine profile:")
	// A short CPU profile: what an operator takes under load.
	code, body = get(t, "http://"+admin+"/debug/pprof/profile?seconds=1")
	require.Equal(t, http.StatusOK, code)
	require.NotEmpty(t, body)

	// The public listener has no profiler, and the admin one nothing else.
	code, body = get(t, "http://"+a.Addr()+"/debug/pprof/")
	require.NotEqual(t, http.StatusOK, code)
	require.NotContains(t, body, "goroutine")
	code, _ = get(t, "http://"+admin+"/metrics")
	require.Equal(t, http.StatusNotFound, code)

	require.NoError(t, a.Stop(context.Background()))
	resp, err := http.Get("http://" + admin + "/debug/pprof/")
	if err == nil {
		resp.Body.Close()
	}
	require.Error(t, err, "Close closes the admin listener too")
}

func TestNoAdminListenerUnlessConfigured(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	a := app.New(cfg, zerolog.Nop())
	a.Deps = app.Deps{PendingMigrations: func(context.Context, *pgxpool.Pool) (int, error) { return 0, nil }}
	require.NoError(t, a.Start(context.Background()))
	t.Cleanup(func() { _ = a.Stop(context.Background()) })
	require.Empty(t, a.AdminAddr())
	code, _ := get(t, "http://"+a.Addr()+"/debug/pprof/")
	require.NotEqual(t, http.StatusOK, code)
}

// TestMetricsOnTheAdminListener: with DROPLINE_METRICS_LISTENER=admin the
// metrics are served on the admin listener and no longer on the API's port.
func TestMetricsOnTheAdminListener(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	cfg.AdminAddr = "127.0.0.1:0"
	cfg.MetricsListener = config.MetricsAdmin
	require.NoError(t, cfg.Validate())
	a := app.New(cfg, zerolog.Nop())
	a.Deps = app.Deps{PendingMigrations: func(context.Context, *pgxpool.Pool) (int, error) { return 0, nil }}
	require.NoError(t, a.Start(context.Background()))
	t.Cleanup(func() { _ = a.Stop(context.Background()) })

	code, body := get(t, "http://"+a.AdminAddr()+"/metrics")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "go_goroutines")
	code, body = get(t, "http://"+a.Addr()+"/metrics")
	require.Equal(t, http.StatusNotFound, code)
	require.NotContains(t, body, "go_goroutines")
}
