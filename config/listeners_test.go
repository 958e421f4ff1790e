package config_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/config"
	"github.com/dropline/dropline/inventory"
	"github.com/dropline/dropline/live"
	"github.com/dropline/dropline/server/graphql"
)

func TestClientAddressAndStreamSettings(t *testing.T) {
	t.Parallel()
	c, err := config.Load(env(map[string]string{
		"DROPLINE_JWT_SECRET":                 goodSecret,
		"DROPLINE_TRUSTED_PROXIES":            "127.0.0.1, 10.0.0.0/8,fd00::/8",
		"DROPLINE_CLIENT_ADDR_HEADER":         "Forwarded",
		"DROPLINE_STREAM_CONNS_PER_IP":        "5000",
		"DROPLINE_STREAM_CONNS_PER_PRINCIPAL": "4",
		"DROPLINE_STREAM_SUBS_PER_CONN":       "8",
		"DROPLINE_STREAM_MESSAGE_BYTES":       "4096",
		"DROPLINE_STREAM_INIT_TIMEOUT":        "2s",
		"DROPLINE_STREAM_PING_INTERVAL":       "20",
		"DROPLINE_STREAM_WRITE_TIMEOUT":       "5s",
	}))
	require.NoError(t, err)
	require.NoError(t, c.Validate())
	require.Equal(t, []string{"127.0.0.1", "10.0.0.0/8", "fd00::/8"}, c.TrustedProxies)
	require.Equal(t, graphql.StreamLimits{
		ConnsPerIP: 5000, ConnsPerPrincipal: 4, SubscriptionsPerConn: 8, MessageBytes: 4096,
		InitTimeout: 2 * time.Second, PingInterval: 20 * time.Second, WriteTimeout: 5 * time.Second,
	}, c.StreamLimits())
	req := httptest.NewRequest(http.MethodGet, "/", nil)
	req.RemoteAddr = "10.1.2.3:9"
	req.Header.Set("Forwarded", "for=203.0.113.4")
	req.Header.Set("X-Forwarded-For", "6.6.6.6")
	require.Equal(t, "203.0.113.4", c.ClientAddr().Addr(req).String())

	// The defaults: nobody trusted, the graphql package's own stream limits.
	d := config.Default()
	require.Empty(t, d.TrustedProxies)
	require.Equal(t, "10.1.2.3", d.ClientAddr().Addr(req).String())
	require.Equal(t, graphql.StreamLimits{
		ConnsPerIP: graphql.DefaultConnsPerIP, ConnsPerPrincipal: graphql.DefaultConnsPerPrincipal,
		SubscriptionsPerConn: graphql.DefaultSubscriptionsPerConn, MessageBytes: graphql.DefaultMessageBytes,
		InitTimeout: graphql.DefaultInitTimeout, PingInterval: graphql.DefaultPingInterval, WriteTimeout: graphql.DefaultWriteTimeout,
	}, d.StreamLimits())

	bad := map[string]string{
		"DROPLINE_TRUSTED_PROXIES":            "10.0.0.0/8,lb.example.com",
		"DROPLINE_CLIENT_ADDR_HEADER":         "x-real-ip",
		"DROPLINE_STREAM_CONNS_PER_IP":        "0",
		"DROPLINE_STREAM_CONNS_PER_PRINCIPAL": "-1",
		"DROPLINE_STREAM_SUBS_PER_CONN":       "0",
		"DROPLINE_STREAM_MESSAGE_BYTES":       "100",
		"DROPLINE_STREAM_INIT_TIMEOUT":        "1ms",
		"DROPLINE_STREAM_PING_INTERVAL":       "0",
		"DROPLINE_STREAM_WRITE_TIMEOUT":       "0s",
	}
	bad["DROPLINE_JWT_SECRET"] = goodSecret
	c, err = config.Load(env(bad))
	require.NoError(t, err)
	var ps config.Problems
	require.ErrorAs(t, c.Validate(), &ps)
	delete(bad, "DROPLINE_JWT_SECRET")
	want := make([]string, 0, len(bad))
	for k := range bad {
		want = append(want, k)
	}
	require.ElementsMatch(t, want, varsOf(ps))
	require.Contains(t, ps.Error(), "lb.example.com")
	require.Equal(t, "10.1.2.3", c.ClientAddr().Addr(req).String(), "an invalid list trusts nobody")

	_, err = config.Load(env(map[string]string{"DROPLINE_STREAM_CONNS_PER_IP": "many"}))
	require.ErrorContains(t, err, "DROPLINE_STREAM_CONNS_PER_IP")
}
func TestAdminListenerIsOptInAndLoopbackOnly(t *testing.T) {
	t.Parallel()
	c, err := config.Load(env(map[string]string{"DROPLINE_JWT_SECRET": goodSecret}))
	require.NoError(t, err)
	require.Empty(t, c.AdminAddr, "no admin listener unless asked for")
	require.NoError(t, c.Validate())

	for _, addr := range []string{"127.0.0.1:6060", "127.0.0.1:0", "[::1]:6060", "localhost:6060"} {
		c, err := config.Load(env(map[string]string{"DROPLINE_JWT_SECRET": goodSecret, "DROPLINE_ADMIN_ADDR": addr}))
		require.NoError(t, err)
		require.Equal(t, addr, c.AdminAddr)
		require.NoError(t, c.Validate(), addr)
	}
	for _, addr := range []string{":6060", "0.0.0.0:6060", "[::]:6060", "10.1.2.3:6060", "ops.example.com:6060"} {
		c, err := config.Load(env(map[string]string{"DROPLINE_JWT_SECRET": goodSecret, "DROPLINE_ADMIN_ADDR": addr}))
		require.NoError(t, err)
		err = c.Validate()
		var ps config.Problems
		require.ErrorAs(t, err, &ps, addr)
		require.Equal(t, []string{config.EnvAdminAddr}, varsOf(ps), addr)
		require.ErrorContains(t, err, config.EnvAdminAllowRemote)

		c, err = config.Load(env(map[string]string{"DROPLINE_JWT_SECRET": goodSecret, "DROPLINE_ADMIN_ADDR": addr, "DROPLINE_ADMIN_ALLOW_REMOTE": "yes"}))
		require.NoError(t, err)
		require.True(t, c.AdminAllowRemote)
		require.NoError(t, c.Validate(), addr)
	}
	for _, addr := range []string{"6060", "127.0.0.1:http-alt", "127.0.0.1:70000"} {
		c, err := config.Load(env(map[string]string{"DROPLINE_JWT_SECRET": goodSecret, "DROPLINE_ADMIN_ADDR": addr, "DROPLINE_ADMIN_ALLOW_REMOTE": "1"}))
		require.NoError(t, err)
		err = c.Validate()
		var ps config.Problems
		require.ErrorAs(t, err, &ps, addr)
		require.Equal(t, []string{config.EnvAdminAddr}, varsOf(ps), addr)
	}
	_, err = config.Load(env(map[string]string{"DROPLINE_ADMIN_ALLOW_REMOTE": "maybe"}))
	require.ErrorContains(t, err, config.EnvAdminAllowRemote)
}
func TestMetricsListenerAndTraces(t *testing.T) {
	t.Parallel()
	c, err := config.Load(env(map[string]string{"DROPLINE_JWT_SECRET": goodSecret}))
	require.NoError(t, err)
	require.Equal(t, config.MetricsPublic, c.MetricsListener, "the API's port serves /metrics by default")
	require.False(t, c.Traces, "no traces unless an OTLP endpoint is set")

	c, err = config.Load(env(map[string]string{"DROPLINE_JWT_SECRET": goodSecret, "DROPLINE_METRICS_LISTENER": "admin"}))
	require.NoError(t, err)
	err = c.Validate()
	var ps config.Problems
	require.ErrorAs(t, err, &ps)
	require.Equal(t, []string{config.EnvMetricsListener}, varsOf(ps), "admin needs an admin listener")
	require.ErrorContains(t, err, config.EnvAdminAddr)

	c, err = config.Load(env(map[string]string{"DROPLINE_JWT_SECRET": goodSecret, "DROPLINE_METRICS_LISTENER": "Admin", "DROPLINE_ADMIN_ADDR": "127.0.0.1:6060"}))
	require.NoError(t, err)
	require.Equal(t, config.MetricsAdmin, c.MetricsListener)
	require.NoError(t, c.Validate())

	c, err = config.Load(env(map[string]string{"DROPLINE_JWT_SECRET": goodSecret, "DROPLINE_METRICS_LISTENER": "both"}))
	require.NoError(t, err)
	require.ErrorAs(t, c.Validate(), &ps)
	require.Equal(t, []string{config.EnvMetricsListener}, varsOf(ps))

	c, err = config.Load(env(map[string]string{"DROPLINE_JWT_SECRET": goodSecret, "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}))
	require.NoError(t, err)
	require.True(t, c.Traces)
}
func TestRedisSentinel(t *testing.T) {
	t.Parallel()
	c := config.Default()
	c.RedisURL = "redis-sentinel://app:s3cret@10.0.0.1:26379,10.0.0.2:26379,10.0.0.3:26379/2?master=shop&sentinel_password=sent1nel&dial_timeout=3s"
	opts, err := c.RedisOptions()
	require.NoError(t, err)
	require.Nil(t, opts.Single)
	require.Nil(t, opts.Cluster)
	require.NotNil(t, opts.Sentinel)
	require.Equal(t, "shop", opts.Sentinel.MasterName)
	require.Equal(t, []string{"10.0.0.1:26379", "10.0.0.2:26379", "10.0.0.3:26379"}, opts.Addrs())
	require.Equal(t, "app", opts.Sentinel.Username)
	require.Equal(t, "s3cret", opts.Sentinel.Password)
	require.Equal(t, "sent1nel", opts.Sentinel.SentinelPassword)
	require.Equal(t, 2, opts.Sentinel.DB)
	require.Equal(t, 3*time.Second, opts.Sentinel.DialTimeout)
	require.Nil(t, opts.Sentinel.TLSConfig)
	require.NotContains(t, config.RedactURL(c.RedisURL), "s3cret")
	require.NotContains(t, config.RedactURL(c.RedisURL), "sent1nel")

	c.RedisURL = "rediss-sentinel://h:26379?master_name=m"
	opts, err = c.RedisOptions()
	require.NoError(t, err)
	require.NotNil(t, opts.Sentinel.TLSConfig)
	require.Equal(t, "m", opts.Sentinel.MasterName)

	for _, bad := range []string{
		"redis-sentinel://h:26379/0",                  // no master name
		"redis-sentinel:///0?master=m",                // no sentinels
		"redis-sentinel://h/0?master=m",               // no port
		"redis-sentinel://h:1/0?master=m&bogus=1",     // unknown option
		"redis-sentinel://u:topsecret@h:1/x?master=m", // bad database
	} {
		c.RedisURL = bad
		_, err := c.RedisOptions()
		require.Error(t, err, bad)
		require.NotContains(t, err.Error(), "topsecret")
		require.ErrorContains(t, c.Validate(), "REDIS_URL", bad)
	}
	c.RedisURL = "redis-sentinel://h:1/0?master=m"
	c.RedisClusterAddrs = []string{"a:1"}
	_, err = c.RedisOptions()
	require.Error(t, err)
}
func TestRedisWaitReplicas(t *testing.T) {
	t.Parallel()
	c, err := config.Load(env(map[string]string{
		"DROPLINE_JWT_SECRET":          goodSecret,
		"REDIS_URL":                    "redis-sentinel://h:26379/0?master=m",
		"DROPLINE_REDIS_WAIT_REPLICAS": "1",
		"DROPLINE_REDIS_WAIT_TIMEOUT":  "20ms",
	}))
	require.NoError(t, err)
	require.NoError(t, c.Validate())
	require.Equal(t, 1, c.RedisWaitReplicas)
	require.Equal(t, 20*time.Millisecond, c.RedisWaitTimeout)
	require.Equal(t, 0, config.Default().RedisWaitReplicas)
	require.Equal(t, 50*time.Millisecond, config.Default().RedisWaitTimeout)

	for vars, bad := range map[string]map[string]string{
		"DROPLINE_REDIS_WAIT_REPLICAS":  {"DROPLINE_REDIS_WAIT_REPLICAS": "-1"},
		"DROPLINE_REDIS_WAIT_TIMEOUT":   {"DROPLINE_REDIS_WAIT_TIMEOUT": "5s"},
		"DROPLINE_REDIS_WAIT_REPLICAS ": {"DROPLINE_REDIS_WAIT_REPLICAS": "1", "REDIS_URL": "redis-cluster://a:1,b:2"},
	} {
		bad["DROPLINE_JWT_SECRET"] = goodSecret
		c, err := config.Load(env(bad))
		require.NoError(t, err)
		var ps config.Problems
		require.ErrorAs(t, c.Validate(), &ps)
		require.Equal(t, []string{strings.TrimSpace(vars)}, varsOf(ps))
	}
	_, err = config.Load(env(map[string]string{"DROPLINE_REDIS_WAIT_TIMEOUT": "soon"}))
	require.ErrorContains(t, err, "DROPLINE_REDIS_WAIT_TIMEOUT")
}
func TestWaitlistMax(t *testing.T) {
	t.Parallel()
	c, err := config.Load(env(map[string]string{"DROPLINE_DEV": "1"}))
	require.NoError(t, err)
	require.Equal(t, 10_000, c.WaitlistMax)
	c, err = config.Load(env(map[string]string{"DROPLINE_DEV": "1", config.EnvWaitlistMax: "50"}))
	require.NoError(t, err)
	require.Equal(t, 50, c.WaitlistMax)
	require.NoError(t, c.Validate())
	for _, bad := range []string{"0", "-3", "100001"} {
		c, err = config.Load(env(map[string]string{"DROPLINE_DEV": "1", config.EnvWaitlistMax: bad}))
		require.NoError(t, err)
		require.ErrorContains(t, c.Validate(), config.EnvWaitlistMax)
	}
	_, err = config.Load(env(map[string]string{"DROPLINE_DEV": "1", config.EnvWaitlistMax: "many"}))
	require.ErrorContains(t, err, config.EnvWaitlistMax)
}
func TestLiveInterval(t *testing.T) {
	t.Parallel()
	c, err := config.Load(env(map[string]string{"DROPLINE_DEV": "1"}))
	require.NoError(t, err)
	require.Equal(t, live.DefaultInterval, c.LiveInterval, "the live package's own default")
	c, err = config.Load(env(map[string]string{"DROPLINE_DEV": "1", config.EnvLiveInterval: "30ms"}))
	require.NoError(t, err)
	require.Equal(t, 30*time.Millisecond, c.LiveInterval)
	require.NoError(t, c.Validate())
	for _, bad := range []string{"0", "500us", "2s"} {
		c, err = config.Load(env(map[string]string{"DROPLINE_DEV": "1", config.EnvLiveInterval: bad}))
		require.NoError(t, err)
		require.ErrorContains(t, c.Validate(), config.EnvLiveInterval, bad)
	}
	_, err = config.Load(env(map[string]string{"DROPLINE_DEV": "1", config.EnvLiveInterval: "soon"}))
	require.ErrorContains(t, err, config.EnvLiveInterval)
}
func TestTestCartPause(t *testing.T) {
	c, err := config.Load(env(map[string]string{"DROPLINE_DEV": "1"}))
	require.NoError(t, err)
	require.Zero(t, c.TestCartPause)
	c, err = config.Load(env(map[string]string{"DROPLINE_DEV": "1", config.EnvTestCartPause: "confirmed:3s"}))
	require.NoError(t, err)
	require.Equal(t, inventory.CartPause{At: inventory.CartPauseConfirmed, For: 3 * time.Second}, c.TestCartPause)
	require.NoError(t, c.Validate())
	for _, bad := range []string{"held:-1s", "held:2m", "later:1s"} {
		c, err = config.Load(env(map[string]string{"DROPLINE_DEV": "1", config.EnvTestCartPause: bad}))
		require.NoError(t, err)
		require.ErrorContains(t, c.Validate(), config.EnvTestCartPause, bad)
	}
	_, err = config.Load(env(map[string]string{"DROPLINE_DEV": "1", config.EnvTestCartPause: "30s"}))
	require.ErrorContains(t, err, config.EnvTestCartPause)
}
func TestTestDrawPause(t *testing.T) {
	c, err := config.Load(env(map[string]string{"DROPLINE_DEV": "1"}))
	require.NoError(t, err)
	require.Zero(t, c.TestDrawPause)
	c, err = config.Load(env(map[string]string{"DROPLINE_DEV": "1", config.EnvTestDrawPause: "applied:3s"}))
	require.NoError(t, err)
	require.Equal(t, inventory.DrawPause{At: inventory.DrawPauseApplied, For: 3 * time.Second}, c.TestDrawPause)
	require.NoError(t, c.Validate())
	for _, bad := range []string{"decided:-1s", "decided:2m", "later:1s"} {
		c, err = config.Load(env(map[string]string{"DROPLINE_DEV": "1", config.EnvTestDrawPause: bad}))
		require.NoError(t, err)
		require.ErrorContains(t, c.Validate(), config.EnvTestDrawPause, bad)
	}
	_, err = config.Load(env(map[string]string{"DROPLINE_DEV": "1", config.EnvTestDrawPause: "30s"}))
	require.ErrorContains(t, err, config.EnvTestDrawPause)
}
