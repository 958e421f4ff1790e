package config_test

import (
	"errors"
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

func env(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

const goodSecret = "0123456789abcdef0123456789abcdef"

func TestLoadDefaults(t *testing.T) {
	t.Parallel()
	c, err := config.Load(env(nil))
	require.NoError(t, err)
	require.Equal(t, config.Default(), c)
	require.Equal(t, "redis://127.0.0.1:6379/0", c.RedisURL)
	require.Equal(t, "postgres://postgres@127.0.0.1:5432/dropline?sslmode=disable", c.DatabaseURL)
	require.Equal(t, ":8080", c.Addr)
	require.Equal(t, "dl:", c.KeyPrefix)
	require.Equal(t, 600*time.Second, c.HoldDefault)
	require.Equal(t, 3600*time.Second, c.HoldMax)
	require.Equal(t, 2, c.HoldExtensions)
	require.Equal(t, 15*time.Second, c.ShutdownTimeout)
	require.Equal(t, "info", c.LogLevel)
	require.Equal(t, "json", c.LogFormat)
	require.Empty(t, c.CORSOrigins)
	require.False(t, c.Dev)

	// Without a secret and without dev mode the defaults are not enough,
	// and the error says how to fix it.
	err = c.Validate()
	var ps config.Problems
	require.ErrorAs(t, err, &ps)
	require.Equal(t, []string{config.EnvJWTSecret}, varsOf(ps))
	require.Contains(t, err.Error(), "DROPLINE_DEV=1")
	require.NotContains(t, err.Error(), "\n", "startup errors are one line")
}

func TestLoadAll(t *testing.T) {
	t.Parallel()
	c, err := config.Load(env(map[string]string{
		"REDIS_URL":                 "redis://:pw@10.0.0.1:6380/2",
		"DATABASE_URL":              "postgres://u:p@db:5432/x",
		"DROPLINE_ADDR":             "127.0.0.1:0",
		"DROPLINE_JWT_SECRET":       goodSecret,
		"DROPLINE_DEV":              "yes",
		"DROPLINE_KEY_PREFIX":       "t1:",
		"DROPLINE_HOLD_DEFAULT":     "90",
		"DROPLINE_HOLD_MAX":         "2h",
		"DROPLINE_HOLD_EXTENSIONS":  "0",
		"DROPLINE_CORS_ORIGINS":     " https://a.example , https://b.example:8443,,",
		"DROPLINE_SHUTDOWN_TIMEOUT": "3s",
		"DROPLINE_LOG_LEVEL":        "DEBUG",
		"DROPLINE_LOG_FORMAT":       "json",
	}))
	require.NoError(t, err)
	require.NoError(t, c.Validate())
	require.Equal(t, 90*time.Second, c.HoldDefault)
	require.Equal(t, 2*time.Hour, c.HoldMax)
	require.Zero(t, c.HoldExtensions, "0 turns extensions off")
	require.Equal(t, []string{"https://a.example", "https://b.example:8443"}, c.CORSOrigins)
	require.Equal(t, []string{"https://a.example", "https://b.example:8443", config.DevOrigin}, c.AllowedOrigins())
	require.Equal(t, 3*time.Second, c.ShutdownTimeout)
	require.Equal(t, "debug", c.LogLevel)
	require.Equal(t, "json", c.LogFormat, "an explicit format wins over the dev default")
	require.True(t, c.Dev)
	require.Equal(t, []byte(goodSecret), c.JWTKey())
	require.False(t, c.UsingDevSecret())

	opts, err := c.RedisOptions()
	require.NoError(t, err)
	require.Nil(t, opts.Cluster)
	require.Equal(t, "10.0.0.1:6380", opts.Single.Addr)
	require.Equal(t, 2, opts.Single.DB)
	require.Equal(t, "pw", opts.Single.Password)
}

func TestLoadParseErrors(t *testing.T) {
	t.Parallel()
	_, err := config.Load(env(map[string]string{
		"DROPLINE_DEV":             "maybe",
		"DROPLINE_HOLD_DEFAULT":    "ten minutes",
		"DROPLINE_HOLD_EXTENSIONS": "two",
	}))
	var ps config.Problems
	require.ErrorAs(t, err, &ps)
	require.ElementsMatch(t, []string{"DROPLINE_DEV", "DROPLINE_HOLD_DEFAULT", "DROPLINE_HOLD_EXTENSIONS"}, varsOf(ps))
	require.Contains(t, err.Error(), "Go duration")
}

func TestDevMode(t *testing.T) {
	t.Parallel()
	c, err := config.Load(env(map[string]string{"DROPLINE_DEV": "1"}))
	require.NoError(t, err)
	require.NoError(t, c.Validate())
	require.True(t, c.UsingDevSecret())
	require.Equal(t, []byte(config.DevJWTSecret), c.JWTKey())
	require.GreaterOrEqual(t, len(c.JWTKey()), config.MinJWTSecretLen)
	require.Equal(t, "console", c.LogFormat)
	require.Equal(t, []string{config.DevOrigin}, c.AllowedOrigins())

	// The public dev secret is refused outside dev mode, even when set explicitly.
	c.Dev = false
	c.JWTSecret = config.DevJWTSecret
	require.ErrorContains(t, c.Validate(), "public development secret")
}

func TestValidateNamesTheVariable(t *testing.T) {
	t.Parallel()
	valid := func() config.Config {
		c := config.Default()
		c.JWTSecret = goodSecret
		return c
	}
	require.NoError(t, valid().Validate())

	cases := []struct {
		name   string
		mutate func(*config.Config)
		envVar string
		hint   string
	}{
		{"short secret", func(c *config.Config) { c.JWTSecret = "short" }, "DROPLINE_JWT_SECRET", "openssl rand"},
		{"bad redis scheme", func(c *config.Config) { c.RedisURL = "http://x:1" }, "REDIS_URL", "redis://"},
		{"redis no scheme", func(c *config.Config) { c.RedisURL = "localhost:6379" }, "REDIS_URL", "redis://"},
		{"bad db url", func(c *config.Config) { c.DatabaseURL = "postgres://u@host:notaport/db" }, "DATABASE_URL", "postgres://"},
		{"empty db url", func(c *config.Config) { c.DatabaseURL = "" }, "DATABASE_URL", "postgres://"},
		{"bad addr", func(c *config.Config) { c.Addr = "8080" }, "DROPLINE_ADDR", ":port"},
		{"bad port", func(c *config.Config) { c.Addr = ":99999" }, "DROPLINE_ADDR", ":port"},
		{"prefix braces", func(c *config.Config) { c.KeyPrefix = "{dl}:" }, "DROPLINE_KEY_PREFIX", "hash tags"},
		{"prefix empty", func(c *config.Config) { c.KeyPrefix = "" }, "DROPLINE_KEY_PREFIX", "unset it"},
		{"prefix space", func(c *config.Config) { c.KeyPrefix = "a b" }, "DROPLINE_KEY_PREFIX", "whitespace"},
		{"hold zero", func(c *config.Config) { c.HoldDefault = 0 }, "DROPLINE_HOLD_DEFAULT", "at least 1s"},
		{"max below default", func(c *config.Config) { c.HoldMax = time.Minute }, "DROPLINE_HOLD_MAX", "shorter than"},
		{"max too long", func(c *config.Config) { c.HoldMax = 48 * time.Hour }, "DROPLINE_HOLD_MAX", "capped"},
		{"extensions negative", func(c *config.Config) { c.HoldExtensions = -1 }, "DROPLINE_HOLD_EXTENSIONS", "between 0"},
		{"extensions too many", func(c *config.Config) { c.HoldExtensions = 101 }, "DROPLINE_HOLD_EXTENSIONS", "between 0"},
		{"cors path", func(c *config.Config) { c.CORSOrigins = []string{"https://a.example/app"} }, "DROPLINE_CORS_ORIGINS", "scheme://host"},
		{"cors scheme", func(c *config.Config) { c.CORSOrigins = []string{"a.example"} }, "DROPLINE_CORS_ORIGINS", "scheme://host"},
		{"shutdown", func(c *config.Config) { c.ShutdownTimeout = 0 }, "DROPLINE_SHUTDOWN_TIMEOUT", "positive"},
		{"log level", func(c *config.Config) { c.LogLevel = "loud" }, "DROPLINE_LOG_LEVEL", "debug"},
		{"log format", func(c *config.Config) { c.LogFormat = "xml" }, "DROPLINE_LOG_FORMAT", "json or console"},
		{"cluster db", func(c *config.Config) {
			c.RedisURL = "redis://127.0.0.1:7000/3"
			c.RedisClusterAddrs = []string{"127.0.0.1:7000"}
		}, "REDIS_URL/REDIS_CLUSTER_ADDRS", "database 0"},
		{"cluster node", func(c *config.Config) { c.RedisURL = "redis-cluster://a:1,b" }, "REDIS_URL", "host:port"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := valid()
			tc.mutate(&c)
			err := c.Validate()
			var ps config.Problems
			require.ErrorAs(t, err, &ps)
			require.Equal(t, []string{tc.envVar}, varsOf(ps))
			require.Contains(t, err.Error(), tc.hint)
			require.True(t, strings.HasPrefix(err.Error(), "invalid configuration: "+tc.envVar+": "), err.Error())
		})
	}
}

func TestValidateReportsAllProblemsOnOneLine(t *testing.T) {
	t.Parallel()
	c := config.Default()
	c.Addr = "nope"
	c.LogFormat = "xml"
	err := c.Validate()
	var ps config.Problems
	require.True(t, errors.As(err, &ps))
	require.Equal(t, []string{"DROPLINE_ADDR", "DROPLINE_JWT_SECRET", "DROPLINE_LOG_FORMAT"}, varsOf(ps))
	require.NotContains(t, err.Error(), "\n")
}

func TestRedisCluster(t *testing.T) {
	t.Parallel()

	c := config.Default()
	c.RedisURL = "redis-cluster://user:s3cret@10.0.0.1:7000,10.0.0.2:7001?dial_timeout=3s"
	opts, err := c.RedisOptions()
	require.NoError(t, err)
	require.NotNil(t, opts.Cluster)
	require.Equal(t, []string{"10.0.0.1:7000", "10.0.0.2:7001"}, opts.Addrs())
	require.Equal(t, "user", opts.Cluster.Username)
	require.Equal(t, "s3cret", opts.Cluster.Password)
	require.Equal(t, 3*time.Second, opts.Cluster.DialTimeout)
	require.Nil(t, opts.Cluster.TLSConfig)
	// What the engine requires: a promoted replica's slots within a second.
	require.Equal(t, inventory.ClusterStateReloadInterval, opts.Cluster.ClusterStateReloadInterval)

	c.RedisURL = "rediss-cluster://10.0.0.1:7000/"
	opts, err = c.RedisOptions()
	require.NoError(t, err)
	require.NotNil(t, opts.Cluster.TLSConfig)

	// REDIS_CLUSTER_ADDRS turns a plain URL into cluster mode, keeping its credentials.
	c = config.Default()
	c.RedisURL = "redis://:pw@127.0.0.1:6379"
	c.RedisClusterAddrs = []string{"127.0.0.1:7000", "127.0.0.1:7001", "127.0.0.1:7002"}
	opts, err = c.RedisOptions()
	require.NoError(t, err)
	require.NotNil(t, opts.Cluster)
	require.Equal(t, c.RedisClusterAddrs, opts.Addrs())
	require.Equal(t, "pw", opts.Cluster.Password)

	loaded, err := config.Load(env(map[string]string{"REDIS_CLUSTER_ADDRS": "h1:1, h2:2"}))
	require.NoError(t, err)
	require.Equal(t, []string{"h1:1", "h2:2"}, loaded.RedisClusterAddrs)

	// Errors never show the password.
	c = config.Default()
	c.RedisURL = "redis-cluster://u:topsecret@a:1/5"
	_, err = c.RedisOptions()
	require.Error(t, err)
	require.NotContains(t, err.Error(), "topsecret")
}

func TestRedactURL(t *testing.T) {
	t.Parallel()
	require.NotContains(t, config.RedactURL("postgres://u:hunter2@db/x"), "hunter")
	require.NotContains(t, config.RedactURL("redis-cluster://u:hunter3@a:1,b:2"), "hunter")
	require.Equal(t, "host=db password=xxxxx", config.RedactURL("host=db password=pw"))
	require.Equal(t, config.DefaultDatabaseURL, config.RedactURL(config.DefaultDatabaseURL))
}

func TestCostSettings(t *testing.T) {
	env := map[string]string{"DROPLINE_DEV": "1"}
	get := func(k string) string { return env[k] }
	c, err := config.Load(get)
	require.NoError(t, err)
	require.Equal(t, 2000, c.CostLimit)
	require.Equal(t, 1000, c.CostRate)
	require.Equal(t, 10000, c.CostBurst)
	require.Equal(t, 1<<20, c.ResponseMaxBytes)
	require.NoError(t, c.Validate())

	env[config.EnvCostRate], env[config.EnvCostBurst] = "-1", "0"
	c, err = config.Load(get)
	require.NoError(t, err)
	require.NoError(t, c.Validate(), "a negative rate turns the budgets off")

	for name, bad := range map[string]map[string]string{
		config.EnvCostRate:         {config.EnvCostRate: "0"},
		config.EnvCostBurst:        {config.EnvCostLimit: "5000", config.EnvCostBurst: "4999"},
		config.EnvCostLimit:        {config.EnvCostLimit: "10"},
		config.EnvResponseMaxBytes: {config.EnvResponseMaxBytes: "100"},
	} {
		env = map[string]string{"DROPLINE_DEV": "1"}
		for k, v := range bad {
			env[k] = v
		}
		c, err = config.Load(get)
		require.NoError(t, err)
		require.ErrorContains(t, c.Validate(), name)
	}
}

func TestMutationRateLimitSettings(t *testing.T) {
	env := map[string]string{"DROPLINE_DEV": "1"}
	get := func(k string) string { return env[k] }
	c, err := config.Load(get)
	require.NoError(t, err)
	require.Equal(t, config.DefaultMutationRate, c.MutationRate)
	require.Equal(t, config.DefaultMutationBurst, c.MutationBurst)
	require.NoError(t, c.Validate())

	env[config.EnvMutationRate], env[config.EnvMutationBurst] = "-1", "0"
	c, err = config.Load(get)
	require.NoError(t, err)
	require.Equal(t, -1, c.MutationRate)
	require.NoError(t, c.Validate(), "a negative rate turns the limit off")

	env[config.EnvMutationRate] = "0"
	c, err = config.Load(get)
	require.NoError(t, err)
	require.ErrorContains(t, c.Validate(), config.EnvMutationRate)

	// A burst smaller than the largest cart would refuse that cart for ever.
	env[config.EnvMutationRate], env[config.EnvMutationBurst] = "10", "20"
	c, err = config.Load(get)
	require.NoError(t, err)
	require.ErrorContains(t, c.Validate(), config.EnvMutationBurst)
	env[config.EnvMutationBurst] = "50"
	c, err = config.Load(get)
	require.NoError(t, err)
	require.NoError(t, c.Validate())

	env[config.EnvMutationRate] = "lots"
	_, err = config.Load(get)
	require.ErrorContains(t, err, config.EnvMutationRate)
}

func TestLeaseTTL(t *testing.T) {
	env := map[string]string{"DROPLINE_DEV": "1", config.EnvLeaseTTL: "3s"}
	c, err := config.Load(func(k string) string { return env[k] })
	require.NoError(t, err)
	require.Equal(t, 3*time.Second, c.LeaseTTL)
	require.NoError(t, c.Validate())
	env[config.EnvLeaseTTL] = "200ms"
	c, err = config.Load(func(k string) string { return env[k] })
	require.NoError(t, err)
	require.ErrorContains(t, c.Validate(), config.EnvLeaseTTL)
}

// varsOf lists the variables the problems name, in order.
func varsOf(ps config.Problems) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.Var
	}
	return out
}

func TestRejectionTTL(t *testing.T) {
	t.Parallel()
	c, err := config.Load(env(map[string]string{"DROPLINE_DEV": "1"}))
	require.NoError(t, err)
	require.Equal(t, 5*time.Minute, c.RejectionTTL)
	c, err = config.Load(env(map[string]string{"DROPLINE_DEV": "1", config.EnvRejectionTTL: "90s"}))
	require.NoError(t, err)
	require.Equal(t, 90*time.Second, c.RejectionTTL)
	require.NoError(t, c.Validate())
	for _, bad := range []string{"0", "500ms", "25h"} {
		c, err = config.Load(env(map[string]string{"DROPLINE_DEV": "1", config.EnvRejectionTTL: bad}))
		require.NoError(t, err)
		require.ErrorContains(t, c.Validate(), config.EnvRejectionTTL, bad)
	}
}

func TestDevModeListensOnLoopbackOnly(t *testing.T) {
	t.Parallel()
	c, err := config.Load(env(map[string]string{"DROPLINE_DEV": "1"}))
	require.NoError(t, err)
	require.Equal(t, "127.0.0.1:8080", c.Addr, "dev mode listens on loopback by default")
	require.NoError(t, c.Validate())

	for _, addr := range []string{"127.0.0.1:0", "127.0.0.2:8080", "[::1]:8080", "localhost:8080", "LOCALHOST:9000"} {
		c, err := config.Load(env(map[string]string{"DROPLINE_DEV": "1", "DROPLINE_ADDR": addr}))
		require.NoError(t, err)
		require.NoError(t, c.Validate(), addr)
	}
	for _, addr := range []string{":8080", "0.0.0.0:8080", "[::]:8080", "10.1.2.3:8080", "shop.example.com:8080"} {
		c, err := config.Load(env(map[string]string{"DROPLINE_DEV": "1", "DROPLINE_ADDR": addr}))
		require.NoError(t, err)
		err = c.Validate()
		var ps config.Problems
		require.ErrorAs(t, err, &ps, addr)
		require.Equal(t, []string{config.EnvAddr}, varsOf(ps), addr)
		require.ErrorContains(t, err, config.EnvDevAllowRemote)

		// Allowed only when asked for by name.
		c, err = config.Load(env(map[string]string{"DROPLINE_DEV": "1", "DROPLINE_ADDR": addr, "DROPLINE_DEV_ALLOW_REMOTE": "1"}))
		require.NoError(t, err)
		require.True(t, c.DevAllowRemote)
		require.NoError(t, c.Validate(), addr)
	}

	// Outside dev mode every interface is the default, and a real secret is
	// required: production refuses to start without one.
	c, err = config.Load(env(nil))
	require.NoError(t, err)
	require.Equal(t, ":8080", c.Addr)
	require.ErrorContains(t, c.Validate(), config.EnvJWTSecret)
	c, err = config.Load(env(map[string]string{"DROPLINE_JWT_SECRET": config.DevJWTSecret, "DROPLINE_DEV_ALLOW_REMOTE": "1"}))
	require.NoError(t, err)
	require.ErrorContains(t, c.Validate(), "public development secret")
	c, err = config.Load(env(map[string]string{"DROPLINE_JWT_SECRET": goodSecret}))
	require.NoError(t, err)
	require.NoError(t, c.Validate())

	_, err = config.Load(env(map[string]string{"DROPLINE_DEV_ALLOW_REMOTE": "perhaps"}))
	require.ErrorContains(t, err, config.EnvDevAllowRemote)
}

func TestJWTClaimSettings(t *testing.T) {
	t.Parallel()
	c, err := config.Load(env(map[string]string{"DROPLINE_DEV": "1"}))
	require.NoError(t, err)
	require.Empty(t, c.JWTIssuer)
	require.Empty(t, c.JWTAudience)
	require.Equal(t, 24*time.Hour, c.JWTMaxLifetime, "a day by default")

	c, err = config.Load(env(map[string]string{
		"DROPLINE_DEV": "1", "DROPLINE_JWT_ISSUER": " https://login.example ", "DROPLINE_JWT_AUDIENCE": "shop-eu",
		"DROPLINE_JWT_MAX_LIFETIME": "12h",
	}))
	require.NoError(t, err)
	require.NoError(t, c.Validate())
	require.Equal(t, "https://login.example", c.JWTIssuer)
	require.Equal(t, "shop-eu", c.JWTAudience)
	require.Equal(t, 12*time.Hour, c.JWTMaxLifetime)

	c, err = config.Load(env(map[string]string{"DROPLINE_DEV": "1", "DROPLINE_JWT_MAX_LIFETIME": "0"}))
	require.NoError(t, err)
	require.NoError(t, c.Validate())
	require.Zero(t, c.JWTMaxLifetime, "0 turns the limit off")

	_, err = config.Load(env(map[string]string{"DROPLINE_JWT_MAX_LIFETIME": "forever"}))
	require.ErrorContains(t, err, config.EnvJWTMaxLifetime)
	c, err = config.Load(env(map[string]string{"DROPLINE_DEV": "1", "DROPLINE_JWT_MAX_LIFETIME": "-1h"}))
	require.NoError(t, err)
	require.ErrorContains(t, c.Validate(), config.EnvJWTMaxLifetime)
}

func TestAPQBytesPerAddr(t *testing.T) {
	t.Parallel()
	c, err := config.Load(env(map[string]string{"DROPLINE_DEV": "1"}))
	require.NoError(t, err)
	require.Equal(t, 1<<20, c.APQBytesPerAddr)
	c, err = config.Load(env(map[string]string{"DROPLINE_DEV": "1", "DROPLINE_APQ_BYTES_PER_ADDR": "262144"}))
	require.NoError(t, err)
	require.NoError(t, c.Validate())
	require.Equal(t, 262144, c.APQBytesPerAddr)
	for _, bad := range []string{"0", "1000", "2000000000"} {
		c, err = config.Load(env(map[string]string{"DROPLINE_DEV": "1", "DROPLINE_APQ_BYTES_PER_ADDR": bad}))
		require.NoError(t, err)
		require.ErrorContains(t, c.Validate(), config.EnvAPQBytesPerAddr, bad)
	}
}

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
