package main

import (
	"bufio"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/app"
	"github.com/dropline/dropline/auth"
	"github.com/dropline/dropline/config"
	"github.com/dropline/dropline/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func runCmd(t *testing.T, envm map[string]string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut testenv.LogBuffer
	code = run(context.Background(), nil, args, func(k string) string { return envm[k] }, &out, &errOut)
	return code, out.String(), errOut.String()
}

const secret = "cmd-test-secret-cmd-test-secret-xx"

func TestToken(t *testing.T) {
	t.Parallel()
	code, out, errOut := runCmd(t, map[string]string{"DROPLINE_JWT_SECRET": secret}, "token", "--user", "alice", "--admin", "--ttl", "1h")
	require.Equal(t, 0, code, errOut)
	require.Empty(t, errOut)
	tok := strings.TrimSpace(out)
	require.Equal(t, tok+"\n", out, "token prints just the token")

	iss, err := auth.NewIssuer([]byte(secret))
	require.NoError(t, err)
	p, err := iss.Verify(tok)
	require.NoError(t, err)
	require.Equal(t, "alice", p.ID)
	require.True(t, p.Admin)
	require.WithinDuration(t, time.Now().Add(time.Hour), p.ExpiresAt, 5*time.Second)
}

func TestTokenWithoutSecretUsesDevSecretWithWarning(t *testing.T) {
	t.Parallel()
	code, out, errOut := runCmd(t, nil, "token", "--user", "alice")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, errOut, "development secret")
	dev, err := auth.NewIssuer([]byte(config.DevJWTSecret))
	require.NoError(t, err)
	p, err := dev.Verify(strings.TrimSpace(out))
	require.NoError(t, err)
	require.False(t, p.Admin)
	require.WithinDuration(t, time.Now().Add(24*time.Hour), p.ExpiresAt, 5*time.Second)
}

func TestUsageErrors(t *testing.T) {
	t.Parallel()
	cases := [][]string{
		{},
		{"frobnicate"},
		{"token"},
		{"token", "--user", "bad user"},
		{"token", "--user", "a", "--ttl", "-1h"},
		{"token", "--user", "a", "--bogus"},
		{"seed"},
		{"serve", "extra"},
	}
	for _, args := range cases {
		code, out, _ := runCmd(t, map[string]string{"DROPLINE_DEV": "1"}, args...)
		require.Equal(t, 2, code, "%v", args)
		require.Empty(t, out, "%v", args)
	}

	code, out, _ := runCmd(t, nil, "help")
	require.Equal(t, 0, code)
	require.Contains(t, out, "dropline serve")
	code, _, _ = runCmd(t, nil, "token", "-h")
	require.Equal(t, 0, code)

	code, out, _ = runCmd(t, nil, "version")
	require.Equal(t, 0, code)
	require.True(t, strings.HasPrefix(out, "dropline "), out)
}

func TestInvalidConfigIsOneLine(t *testing.T) {
	t.Parallel()
	code, out, errOut := runCmd(t, map[string]string{"DROPLINE_ADDR": "nope"}, "serve")
	require.Equal(t, 1, code)
	require.Empty(t, out)
	require.Equal(t, 1, strings.Count(errOut, "\n"), errOut)
	require.Contains(t, errOut, "DROPLINE_ADDR")
	require.Contains(t, errOut, "DROPLINE_JWT_SECRET")
}

func closedAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}

func TestServeUnreachableDatabase(t *testing.T) {
	t.Parallel()
	code, out, errOut := runCmd(t, map[string]string{
		"DROPLINE_JWT_SECRET": secret,
		"DROPLINE_ADDR":       "127.0.0.1:0",
		"DATABASE_URL":        "postgres://postgres@" + closedAddr(t) + "/dropline?sslmode=disable",
		"DROPLINE_LOG_LEVEL":  "disabled",
	}, "serve")
	require.Equal(t, 1, code)
	require.Empty(t, out)
	lines := strings.Split(strings.TrimSpace(errOut), "\n")
	require.Len(t, lines, 1, errOut)
	require.Regexp(t, `^dropline: cannot reach PostgreSQL at postgres://postgres@127\.0\.0\.1:\d+/dropline\?sslmode=disable: connection refused — start it with "make services"$`, lines[0])
}

func TestMigrateUnreachableDatabase(t *testing.T) {
	t.Parallel()
	code, _, errOut := runCmd(t, map[string]string{
		"DROPLINE_DEV": "1",
		"DATABASE_URL": "postgres://postgres@" + closedAddr(t) + "/dropline",
	}, "migrate")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "dropline: ")
}

// serving is a `dropline serve` running in the test's process.
type serving struct {
	addr        string
	done        chan int // the exit code, once serve returns
	out, errOut *testenv.LogBuffer
}

// startServe runs the serve command until ctx ends and returns once it logs
// that it is serving (envm must not turn JSON logs off).
func startServe(ctx context.Context, t *testing.T, envm map[string]string) serving {
	t.Helper()
	s := serving{done: make(chan int, 1), out: &testenv.LogBuffer{}, errOut: &testenv.LogBuffer{}}
	go func() {
		s.done <- run(ctx, func() {}, []string{"serve"}, func(k string) string { return envm[k] }, s.out, s.errOut)
	}()
	exited := false
	require.Eventually(t, func() bool {
		sc := bufio.NewScanner(strings.NewReader(s.errOut.String()))
		for sc.Scan() {
			var line map[string]any
			if json.Unmarshal(sc.Bytes(), &line) == nil && line["message"] == "dropline is serving" {
				s.addr, _ = line["addr"].(string)
				return true
			}
		}
		select {
		case code := <-s.done:
			s.done <- code
			exited = true
			return true
		default:
		}
		return false
	}, 15*time.Second, 20*time.Millisecond)
	require.False(t, exited, "serve exited: %s", s.errOut.String())
	return s
}

// TestSeedBeforeMigrate: seeding a database that has no schema yet says
// what to do, instead of a retryable "temporarily unavailable", and leaves
// the database as it was.
func TestSeedBeforeMigrate(t *testing.T) {
	t.Parallel()
	dbURL := testenv.NewUnmigratedDatabase(t)
	envm := map[string]string{
		"DROPLINE_DEV":        "1",
		"DATABASE_URL":        dbURL,
		"REDIS_URL":           os.Getenv("REDIS_URL"),
		"DROPLINE_KEY_PREFIX": testenv.Redis(t).Prefix,
		"DROPLINE_LOG_LEVEL":  "disabled",
	}
	code, out, errOut := runCmd(t, envm, "seed", "--demo")
	require.Equal(t, 1, code, errOut)
	require.Empty(t, out)
	lines := strings.Split(strings.TrimSpace(errOut), "\n")
	require.Len(t, lines, 1, errOut)
	require.Contains(t, lines[0], "run `dropline migrate` first")
	require.NotContains(t, lines[0], "temporarily unavailable")

	// Nothing was created, not even the migrations table; once migrated,
	// the same command seeds.
	pool, err := pgxpool.New(context.Background(), dbURL)
	require.NoError(t, err)
	defer pool.Close()
	var tables int
	require.NoError(t, pool.QueryRow(context.Background(),
		`SELECT count(*) FROM pg_tables WHERE schemaname = 'public'`).Scan(&tables))
	require.Zero(t, tables)

	code, _, errOut = runCmd(t, envm, "migrate")
	require.Equal(t, 0, code, errOut)
	code, _, errOut = runCmd(t, envm, "seed", "--demo")
	require.Equal(t, 0, code, errOut)
	rows, err := pool.Query(context.Background(), `SELECT sku FROM products ORDER BY sku`)
	require.NoError(t, err)
	skus, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"CAP-LOGO", "DRAW-JACKET", "DROP-HOODIE", "DROP-SNEAKER-01", "POSTER-SIGNED", "TEE-BLACK-M", "TRAINER-42", "TRAINER-43"}, skus)
	var presale, codes int
	require.NoError(t, pool.QueryRow(context.Background(),
		`SELECT count(*) FROM products WHERE drop_id = 'PRESALE-TRAINERS'`).Scan(&presale))
	require.Equal(t, 2, presale, "the presale drop's two sizes")
	require.NoError(t, pool.QueryRow(context.Background(),
		`SELECT count(*) FROM queue_access_codes WHERE queue_id = 'drop:PRESALE-TRAINERS' AND principal IS NULL`).Scan(&codes))
	require.Equal(t, 20, codes, "the presale's access codes, all unused")
	// Seeding again changes nothing.
	code, _, errOut = runCmd(t, envm, "seed", "--demo")
	require.Equal(t, 0, code, errOut)
	var draws int
	require.NoError(t, pool.QueryRow(context.Background(),
		`SELECT count(*) FROM draws WHERE sku = 'DRAW-JACKET' AND closes_at BETWEEN now() + interval '1 minute' AND now() + interval '10 minutes'`).Scan(&draws))
	require.Equal(t, 1, draws, "the demo draw closes a few minutes after the seed")
}

// TestServeAndSignal runs the real serve command against the real services
// and stops it as SIGTERM would.
func TestServeAndSignal(t *testing.T) {
	t.Parallel()
	// A migrated database of the test's own: the worker group runs for real.
	dbURL := testenv.NewDatabase(t)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	envm := map[string]string{
		"DROPLINE_JWT_SECRET": secret,
		"DROPLINE_ADDR":       "127.0.0.1:0",
		"DATABASE_URL":        dbURL,
		"REDIS_URL":           os.Getenv("REDIS_URL"),
		"DROPLINE_KEY_PREFIX": testenv.Redis(t).Prefix, // this test's own keys, deleted when it ends
	}
	s := startServe(ctx, t, envm)
	addr, done, out, errOut := s.addr, s.done, s.out, s.errOut

	resp, err := http.Get("http://" + addr + "/healthz")
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, http.StatusOK, resp.StatusCode)

	cancel() // what SIGINT/SIGTERM does through signal.NotifyContext
	select {
	case code := <-done:
		require.Equal(t, 0, code, errOut.String())
	case <-time.After(15 * time.Second):
		t.Fatal("serve did not shut down")
	}
	require.Contains(t, errOut.String(), "dropline stopped")
	require.Empty(t, out.String())
}

func TestServeRefusesDevModeOnEveryInterface(t *testing.T) {
	t.Parallel()
	base := map[string]string{
		"DROPLINE_DEV":       "1",
		"DATABASE_URL":       "postgres://postgres@" + closedAddr(t) + "/dropline?sslmode=disable",
		"DROPLINE_LOG_LEVEL": "disabled",
	}
	for _, addr := range []string{":0", "0.0.0.0:0", "[::]:0"} {
		env := map[string]string{"DROPLINE_ADDR": addr}
		for k, v := range base {
			env[k] = v
		}
		code, out, errOut := runCmd(t, env, "serve")
		require.Equal(t, 1, code, addr)
		require.Empty(t, out)
		require.Equal(t, 1, strings.Count(errOut, "\n"), errOut)
		require.Contains(t, errOut, "DROPLINE_ADDR", addr)
		require.Contains(t, errOut, "DROPLINE_DEV_ALLOW_REMOTE", addr)
		require.NotContains(t, errOut, "PostgreSQL", "refused before anything is touched")
	}
	// Production without a real secret refuses to start too.
	code, _, errOut := runCmd(t, map[string]string{"DROPLINE_ADDR": "127.0.0.1:0", "DATABASE_URL": base["DATABASE_URL"]}, "serve")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "DROPLINE_JWT_SECRET: is not set")
}

func TestTokenWritesIssuerAudienceAndKeepsToMaxLifetime(t *testing.T) {
	t.Parallel()
	envm := map[string]string{
		"DROPLINE_JWT_SECRET": secret, "DROPLINE_JWT_ISSUER": "https://login.shop.example",
		"DROPLINE_JWT_AUDIENCE": "dropline-eu", "DROPLINE_JWT_MAX_LIFETIME": "2h",
	}
	code, out, errOut := runCmd(t, envm, "token", "--user", "alice")
	require.Equal(t, 0, code, errOut)
	cfg, err := config.Load(func(k string) string { return envm[k] })
	require.NoError(t, err)
	server, err := app.NewIssuer(cfg)
	require.NoError(t, err)
	p, err := server.Verify(strings.TrimSpace(out))
	require.NoError(t, err, "the server accepts what token mints")
	require.WithinDuration(t, time.Now().Add(2*time.Hour), p.ExpiresAt, 5*time.Second, "the default ttl shrinks to the maximum lifetime")

	// A server with another audience refuses it.
	cfg.JWTAudience = "dropline-us"
	other, err := app.NewIssuer(cfg)
	require.NoError(t, err)
	_, err = other.Verify(strings.TrimSpace(out))
	require.ErrorIs(t, err, auth.ErrTokenInvalid)

	code, out, errOut = runCmd(t, envm, "token", "--user", "alice", "--ttl", "3h")
	require.Equal(t, 2, code)
	require.Empty(t, out)
	require.Contains(t, errOut, "DROPLINE_JWT_MAX_LIFETIME")
}

func TestServeDefaultsTheGCTargetUnlessGOGCIsSet(t *testing.T) {
	prev := debug.SetGCPercent(100)
	t.Cleanup(func() { debug.SetGCPercent(prev) })

	pct, set := defaultGC(func(string) string { return "" })
	require.True(t, set)
	require.Equal(t, DefaultGCPercent, pct)
	require.Equal(t, DefaultGCPercent, debug.SetGCPercent(100), "the runtime got Dropline's default")

	_, set = defaultGC(func(k string) string {
		if k == "GOGC" {
			return "150"
		}
		return ""
	})
	require.False(t, set)
	require.Equal(t, 100, debug.SetGCPercent(100), "an operator's GOGC is left to the runtime")
}
