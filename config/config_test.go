package config_test

import (
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/config"
	"github.com/dropline/dropline/inventory"
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

func TestGateSettings(t *testing.T) {
	t.Parallel()
	c, err := config.Load(env(map[string]string{"DROPLINE_DEV": "1"}))
	require.NoError(t, err)
	require.NoError(t, c.Validate())
	require.Zero(t, c.GateSlots, "the gate is off unless asked for")
	require.Equal(t, 10*time.Second, c.GateWait)
	require.Equal(t, 8*runtime.GOMAXPROCS(0), config.SuggestedGateSlots())
	c, err = config.Load(env(map[string]string{"DROPLINE_DEV": "1", "DROPLINE_GATE_SLOTS": "16", "DROPLINE_GATE_WAIT": "2s"}))
	require.NoError(t, err)
	require.NoError(t, c.Validate())
	require.Equal(t, 16, c.GateSlots)
	require.Equal(t, 2*time.Second, c.GateWait)
	for _, bad := range []string{"-1", "5000"} {
		c, err = config.Load(env(map[string]string{"DROPLINE_DEV": "1", "DROPLINE_GATE_SLOTS": bad}))
		require.NoError(t, err)
		require.ErrorContains(t, c.Validate(), config.EnvGateSlots, bad)
	}
	for _, bad := range []string{"10ms", "2m"} {
		c, err = config.Load(env(map[string]string{"DROPLINE_DEV": "1", "DROPLINE_GATE_WAIT": bad}))
		require.NoError(t, err)
		require.ErrorContains(t, c.Validate(), config.EnvGateWait)
	}
}
