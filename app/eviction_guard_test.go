package app_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/app"
	"github.com/dropline/dropline/internal/testenv"
)

// Against a Redis that evicts keys the App does not start, and says which
// setting to change; a Redis whose policy turns evicting while it serves
// is refused from its next connection on (not ready, every command an
// error naming the policy) and served again once it is noeviction; a Redis
// that does not let the policy be read is served with one warning.
func TestEvictingRedisIsRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	noDeps := app.Deps{PendingMigrations: func(context.Context, *pgxpool.Pool) (int, error) { return 0, nil }}

	t.Run("at start", func(t *testing.T) {
		t.Parallel()
		srv := testenv.StartServer(t, "--maxmemory-policy", "allkeys-lru")
		cfg := testConfig(t)
		cfg.RedisURL = "redis://" + srv.Addr + "/0"
		a := app.New(cfg, zerolog.Nop())
		a.Deps = noDeps
		err := a.Start(ctx)
		require.Error(t, err)
		require.Contains(t, err.Error(), "maxmemory-policy allkeys-lru")
		require.Contains(t, err.Error(), "refusing to serve")
		require.Contains(t, err.Error(), srv.Addr)
		require.NotContains(t, err.Error(), "\n")
	})

	t.Run("on reconnect", func(t *testing.T) {
		t.Parallel()
		srv := testenv.StartServer(t, "--maxmemory-policy", "noeviction")
		direct := redis.NewClient(&redis.Options{Addr: srv.Addr})
		t.Cleanup(func() { _ = direct.Close() })
		cfg := testConfig(t)
		cfg.RedisURL = "redis://" + srv.Addr + "/0"
		cfg.AdminAddr = "127.0.0.1:0"
		logs := &testenv.LogBuffer{}
		a := app.New(cfg, zerolog.New(logs))
		a.Deps = noDeps
		require.NoError(t, a.Start(ctx))
		t.Cleanup(func() { _ = a.Stop(ctx) })
		require.NoError(t, a.Redis().Ping(ctx).Err())

		require.NoError(t, direct.ConfigSet(ctx, "maxmemory-policy", "volatile-ttl").Err())
		require.NoError(t, direct.ClientKillByFilter(ctx, "TYPE", "normal", "SKIPME", "yes").Err())
		err := a.Redis().Ping(ctx).Err()
		var evicting *app.EvictingRedisError
		require.True(t, errors.As(err, &evicting), "%v", err)
		require.Equal(t, "volatile-ttl", evicting.Policy)
		code, _ := get(t, "http://"+a.Addr()+"/readyz")
		require.Equal(t, http.StatusServiceUnavailable, code)
		code, body := get(t, "http://"+a.AdminAddr()+"/readyz")
		require.Equal(t, http.StatusServiceUnavailable, code)
		require.Contains(t, body, "maxmemory-policy volatile-ttl")
		require.Equal(t, 1, strings.Count(logs.String(), `"maxmemory_policy":"volatile-ttl"`), "logged once:\n%s", logs.String())

		require.NoError(t, direct.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err())
		require.Eventually(t, func() bool { return a.Redis().Ping(ctx).Err() == nil }, 5*time.Second, 20*time.Millisecond)
		code, _ = get(t, "http://"+a.Addr()+"/readyz")
		require.Equal(t, http.StatusOK, code)
	})

	t.Run("CONFIG not allowed", func(t *testing.T) {
		t.Parallel()
		srv := testenv.StartServer(t, "--rename-command", "CONFIG", "")
		cfg := testConfig(t)
		cfg.RedisURL = "redis://" + srv.Addr + "/0"
		logs := &testenv.LogBuffer{}
		a := app.New(cfg, zerolog.New(logs))
		a.Deps = noDeps
		require.NoError(t, a.Start(ctx))
		t.Cleanup(func() { _ = a.Stop(ctx) })
		for range 5 { // more connections, one warning
			c := a.Redis().(*redis.Client).Conn()
			require.NoError(t, c.Ping(ctx).Err())
			require.NoError(t, c.Close())
		}
		require.Equal(t, 1, strings.Count(logs.String(), "cannot read Redis' maxmemory-policy"), logs.String())
	})
}
