package config

import (
	"fmt"
	"net"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"

	"github.com/dropline/dropline/internal/clientaddr"
	"github.com/dropline/dropline/inventory"
)

// Problem is one invalid setting: the variable it came from and a message
// that says what is wrong and how to fix it.
type Problem struct {
	Var string
	Msg string
}

// Error renders the problem as "VAR: message".
func (p Problem) Error() string { return p.Var + ": " + p.Msg }

// Problems is every invalid setting found at once, so an operator fixes
// them in one go instead of one restart per mistake. It renders as a single
// line because startup failures print exactly one line.
type Problems []Problem

// Error joins the problems with "; ".
func (ps Problems) Error() string {
	parts := make([]string, len(ps))
	for i, p := range ps {
		parts[i] = p.Error()
	}
	return "invalid configuration: " + strings.Join(parts, "; ")
}

// maxHold caps DROPLINE_HOLD_MAX: idempotency records live 24 h, and a hold
// must never outlive the record that deduplicates it.
const maxHold = inventory.DefaultIdempotencyTTL

// maxHoldExtensions caps DROPLINE_HOLD_EXTENSIONS: every extension is a
// ledger row, and HoldMax bounds the hold whatever the count.
const maxHoldExtensions = 100

// Validate checks every setting and returns nil or a Problems value naming
// each bad variable and how to fix it. It does not touch the network: an
// unreachable service is found when the App connects.
func (c Config) Validate() error {
	var ps Problems
	add := func(v, format string, args ...any) {
		ps = append(ps, Problem{Var: v, Msg: fmt.Sprintf(format, args...)})
	}

	if _, err := c.RedisOptions(); err != nil {
		v := EnvRedisURL
		if len(c.RedisClusterAddrs) > 0 {
			v = EnvRedisURL + "/" + EnvRedisClusterAddrs
		}
		add(v, "%v: use redis://host:port/db, redis-cluster://host1:port1,host2:port2 or redis-sentinel://sentinel1:26379,sentinel2:26379/db?master=NAME (default %s)", err, DefaultRedisURL)
	}

	switch ro, err := c.RedisOptions(); {
	case c.RedisWaitReplicas < 0:
		add(EnvRedisWaitReplicas, "is %d: set how many replicas must have each reserve before it is answered, or 0 not to wait", c.RedisWaitReplicas)
	case c.RedisWaitReplicas > 0 && err == nil && ro.Cluster != nil:
		add(EnvRedisWaitReplicas, "is %d, but Redis is a cluster: waiting for replicas needs a single primary (redis:// or redis-sentinel://)", c.RedisWaitReplicas)
	}
	if c.RedisWaitTimeout < time.Millisecond || c.RedisWaitTimeout > time.Second {
		add(EnvRedisWaitTimeout, "is %s: set between 1ms and 1s (default %s); it is added to a reserve's latency whenever replicas lag", c.RedisWaitTimeout, DefaultRedisWaitTimeout)
	}

	if c.DatabaseURL == "" {
		add(EnvDatabaseURL, "is empty: set it to a PostgreSQL URL such as %s", DefaultDatabaseURL)
	} else if _, err := pgxpool.ParseConfig(c.DatabaseURL); err != nil {
		add(EnvDatabaseURL, "cannot be parsed (%v): use a URL such as %s", err, DefaultDatabaseURL)
	}

	if err := checkListenAddr(c.Addr); err != nil {
		add(EnvAddr, "%q %v: use host:port or :port, e.g. %s (port 0 picks a free port)", c.Addr, err, DefaultAddr)
	} else if c.Dev && !c.DevAllowRemote && !LoopbackAddr(c.Addr) {
		add(EnvAddr, "%q is reachable from other hosts, and dev mode signs tokens with a public secret (anyone who reaches the port could mint an admin token): listen on loopback (%s, the dev-mode default), or set %s=1 if only you can reach this network", c.Addr, DefaultDevAddr, EnvDevAllowRemote)
	}
	if c.AdminAddr != "" {
		if err := checkListenAddr(c.AdminAddr); err != nil {
			add(EnvAdminAddr, "%q %v: use host:port on loopback, e.g. 127.0.0.1:6060, or leave it empty for no admin listener", c.AdminAddr, err)
		} else if !c.AdminAllowRemote && !LoopbackAddr(c.AdminAddr) {
			add(EnvAdminAddr, "%q is reachable from other hosts, and the profiler it serves has no authentication: listen on loopback (e.g. 127.0.0.1:6060), or set %s=1 if only operators can reach this network", c.AdminAddr, EnvAdminAllowRemote)
		}
	}
	switch c.MetricsListener {
	case MetricsPublic:
	case MetricsAdmin:
		if c.AdminAddr == "" {
			add(EnvMetricsListener, "is %q, but there is no admin listener: set %s too (e.g. 127.0.0.1:6060), or serve /metrics on the API's port with %q", c.MetricsListener, EnvAdminAddr, MetricsPublic)
		}
	default:
		add(EnvMetricsListener, "is %q: use %q (the API's port, the default) or %q (the admin listener, %s)", c.MetricsListener, MetricsPublic, MetricsAdmin, EnvAdminAddr)
	}
	if c.JWTMaxLifetime < 0 {
		add(EnvJWTMaxLifetime, "is %s: set the longest a token may be valid for (default %s), or 0 for no limit", c.JWTMaxLifetime, DefaultJWTMaxLifetime)
	}

	switch {
	case c.JWTSecret == "" && !c.Dev:
		add(EnvJWTSecret, "is not set: set it to a random secret of at least %d bytes (e.g. `openssl rand -hex 32`), or set %s=1 for local development with a built-in secret", MinJWTSecretLen, EnvDev)
	case c.JWTSecret == DevJWTSecret && !c.Dev:
		add(EnvJWTSecret, "is the public development secret: generate a real one with `openssl rand -hex 32`")
	case c.JWTSecret != "" && len(c.JWTSecret) < MinJWTSecretLen:
		add(EnvJWTSecret, "is %d bytes; HS256 needs at least %d: generate one with `openssl rand -hex 32`", len(c.JWTSecret), MinJWTSecretLen)
	}

	switch {
	case c.KeyPrefix == "":
		add(EnvKeyPrefix, "is empty: unset it to use %q, or pick a short namespace such as \"shop1:\"", DefaultKeyPrefix)
	case len(c.KeyPrefix) > 64:
		add(EnvKeyPrefix, "is %d bytes: keep it at most 64", len(c.KeyPrefix))
	case strings.ContainsAny(c.KeyPrefix, "{}"):
		add(EnvKeyPrefix, "%q contains '{' or '}': hash tags are added by Dropline's key layout, remove them from the prefix", c.KeyPrefix)
	case strings.IndexFunc(c.KeyPrefix, func(r rune) bool { return r <= ' ' || r == 0x7f }) >= 0:
		add(EnvKeyPrefix, "%q contains whitespace or control characters: use letters, digits and ':'", c.KeyPrefix)
	}

	if c.HoldDefault < time.Second {
		add(EnvHoldDefault, "is %s: set a hold of at least 1s (default %s)", c.HoldDefault, DefaultHoldDefault)
	}
	switch {
	case c.HoldMax > maxHold:
		add(EnvHoldMax, "is %s: holds are capped at %s, the lifetime of idempotency records", c.HoldMax, maxHold)
	case c.HoldMax < c.HoldDefault:
		add(EnvHoldMax, "is %s, shorter than %s (%s): raise it or lower the default", c.HoldMax, EnvHoldDefault, c.HoldDefault)
	}

	if c.HoldExtensions < 0 || c.HoldExtensions > maxHoldExtensions {
		add(EnvHoldExtensions, "is %d: allow between 0 (no extensions) and %d extensions of a hold (default %d)", c.HoldExtensions, maxHoldExtensions, DefaultHoldExtensions)
	}

	if c.LeaseTTL < time.Second {
		add(EnvLeaseTTL, "is %s: leases need at least 1s (default %s)", c.LeaseTTL, DefaultLeaseTTL)
	}
	if c.RejectionTTL < time.Second || c.RejectionTTL > maxHold {
		add(EnvRejectionTTL, "is %s: a refused reserve replays for between 1s and %s (default %s); the shorter, the less Redis keeps per refused request", c.RejectionTTL, maxHold, DefaultRejectionTTL)
	}
	if c.WaitlistMax < 1 || c.WaitlistMax > inventory.MaxWaitlistMax {
		add(EnvWaitlistMax, "is %d: a SKU's waitlist holds between 1 and %d waiters (default %d)", c.WaitlistMax, inventory.MaxWaitlistMax, DefaultWaitlistMax)
	}
	if p := c.TestCartPause; p != (inventory.CartPause{}) &&
		(p.At != inventory.CartPauseHeld && p.At != inventory.CartPauseConfirmed || p.For < 0 || p.For > time.Minute) {
		add(EnvTestCartPause, "is %s:%s: a test-only pause of a cart at %q or %q, for 0 to 1m (default: none)", p.At, p.For, inventory.CartPauseHeld, inventory.CartPauseConfirmed)
	}
	if p := c.TestDrawPause; p != (inventory.DrawPause{}) &&
		(p.At != inventory.DrawPauseDecided && p.At != inventory.DrawPauseApplied || p.For < 0 || p.For > time.Minute) {
		add(EnvTestDrawPause, "is %s:%s: a test-only pause of a draw at %q or %q, for 0 to 1m (default: none)", p.At, p.For, inventory.DrawPauseDecided, inventory.DrawPauseApplied)
	}
	if c.MutationRate == 0 {
		add(EnvMutationRate, "is 0, which would refuse every mutation: set mutations per second per principal (default %d), or a negative number to turn the limit off", DefaultMutationRate)
	}
	if c.MutationRate > 0 && c.MutationBurst < inventory.MaxCartLines {
		add(EnvMutationBurst, "is %d: a cart spends one mutation per line, so a principal must be able to send at least %d at once, the most lines of a cart (default %d)",
			c.MutationBurst, inventory.MaxCartLines, DefaultMutationBurst)
	}
	if c.CostLimit < 100 {
		add(EnvCostLimit, "is %d: set the most one operation may cost, at least 100 (default %d)", c.CostLimit, DefaultCostLimit)
	}
	if c.CostRate == 0 {
		add(EnvCostRate, "is 0, which would refuse every operation once a budget is spent: set cost points per second per caller (default %d), or a negative number to turn the budgets off", DefaultCostRate)
	}
	if c.CostRate > 0 && c.CostBurst < c.CostLimit {
		add(EnvCostBurst, "is %d, less than %s (%d): an operation costing the limit could never run; set at least that (default %d)", c.CostBurst, EnvCostLimit, c.CostLimit, DefaultCostBurst)
	}
	if c.ResponseMaxBytes < 1<<10 || c.ResponseMaxBytes > 64<<20 {
		add(EnvResponseMaxBytes, "is %d: a response bound must be between 1024 and 67108864 bytes (default %d)", c.ResponseMaxBytes, DefaultResponseMaxBytes)
	}

	for _, o := range c.CORSOrigins {
		if err := checkOrigin(o); err != nil {
			add(EnvCORSOrigins, "%q %v: list origins as scheme://host[:port] without a path, comma separated, or \"*\"", o, err)
		}
	}

	if c.ShutdownTimeout <= 0 {
		add(EnvShutdownTimeout, "is %s: set a positive duration such as %s", c.ShutdownTimeout, DefaultShutdownTimeout)
	}

	if _, err := zerolog.ParseLevel(c.LogLevel); err != nil || c.LogLevel == "" {
		add(EnvLogLevel, "%q is not a level: use trace, debug, info, warn, error or disabled", c.LogLevel)
	}
	if c.LogFormat != LogFormatJSON && c.LogFormat != LogFormatConsole {
		add(EnvLogFormat, "%q is not a format: use json or console", c.LogFormat)
	}

	if _, err := clientaddr.ParsePrefixes(c.TrustedProxies); err != nil {
		add(EnvTrustedProxies, "%v: list the load balancers' addresses, comma separated (default: none, the TCP peer is the client)", err)
	}
	if _, err := clientaddr.ParseHeader(c.ClientAddrHeader); err != nil {
		add(EnvClientAddrHeader, "%v: name the one header your proxy writes (default %s)", err, DefaultClientAddrHeader)
	}
	atLeast := func(v string, n, min int, what string) {
		if n < min {
			add(v, "is %d: %s must be at least %d", n, what, min)
		}
	}
	atLeast(EnvStreamConnsPerIP, c.StreamConnsPerIP, 1, "the open stream connections allowed per client address")
	atLeast(EnvStreamConnsPerPrin, c.StreamConnsPerPrincipal, 1, "the open stream connections allowed per principal")
	atLeast(EnvStreamSubsPerConn, c.StreamSubsPerConn, 1, "the subscriptions allowed per websocket")
	if c.StreamMessageBytes < 1<<10 || c.StreamMessageBytes > 1<<20 {
		add(EnvStreamMessageBytes, "is %d: a websocket message cap must be between 1024 and 1048576 bytes (default %d)", c.StreamMessageBytes, DefaultStreamMessageBytes)
	}
	positive := func(v string, d, min, def time.Duration) {
		if d < min {
			add(v, "is %s: set at least %s (default %s)", d, min, def)
		}
	}
	positive(EnvStreamInitTimeout, c.StreamInitTimeout, 100*time.Millisecond, DefaultStreamInitTimeout)
	positive(EnvStreamPingInterval, c.StreamPingInterval, time.Second, DefaultStreamPingInterval)
	positive(EnvStreamWriteTimeout, c.StreamWriteTimeout, 100*time.Millisecond, DefaultStreamWriteTimeout)
	if c.LiveInterval < time.Millisecond || c.LiveInterval > time.Second {
		add(EnvLiveInterval, "is %s: the live delivery interval must be between 1ms and 1s (default %s)", c.LiveInterval, DefaultLiveInterval)
	}

	if c.BodyTimeout < time.Second || c.BodyTimeout > time.Minute {
		add(EnvBodyTimeout, "is %s: the time to send a request body must be between 1s and 1m (default %s)", c.BodyTimeout, DefaultBodyTimeout)
	}
	atLeast(EnvRequestsPerAddr, c.RequestsPerAddr, 1, "the requests in flight allowed per client address")
	if c.GateSlots < 0 || c.GateSlots > 4096 {
		add(EnvGateSlots, "is %d: the operations that are not commits or cancels running at once must be between 1 and 4096, or 0 for no gate (the default; 8 per core, %d here, is where to start)", c.GateSlots, SuggestedGateSlots())
	}
	if c.GateWait < 100*time.Millisecond || c.GateWait > time.Minute {
		add(EnvGateWait, "is %s: the longest wait for a slot of the gate must be between 100ms and 1m (default %s)", c.GateWait, DefaultGateWait)
	}
	if c.APQBytesPerAddr < 64<<10 || c.APQBytesPerAddr > 1<<30 {
		add(EnvAPQBytesPerAddr, "is %d: the persisted-query bytes one address may register must be between 65536 and 1073741824 (default %d)", c.APQBytesPerAddr, DefaultAPQBytesPerAddr)
	}

	if c.WebhookTimeout < 100*time.Millisecond || c.WebhookTimeout > time.Minute {
		add(EnvWebhookTimeout, "is %s: a webhook attempt's bound must be between 100ms and 1m (default %s)", c.WebhookTimeout, DefaultWebhookTimeout)
	}
	if c.WebhookConcurrency < 1 || c.WebhookConcurrency > 64 {
		add(EnvWebhookConcurrency, "is %d: the deliveries in flight per endpoint must be between 1 and 64 (default %d)", c.WebhookConcurrency, DefaultWebhookConcurrency)
	}
	if c.WebhookMaxAttempts < 1 || c.WebhookMaxAttempts > 100 {
		add(EnvWebhookMaxAttempts, "is %d: a delivery's attempts must be between 1 and 100 (default %d)", c.WebhookMaxAttempts, DefaultWebhookMaxAttempts)
	}
	if c.WebhookBackoff < 10*time.Millisecond || c.WebhookBackoff > c.WebhookBackoffMax {
		add(EnvWebhookBackoff, "is %s: the first retry's wait must be at least 10ms and at most %s (%s; default %s)", c.WebhookBackoff, EnvWebhookBackoffMax, c.WebhookBackoffMax, DefaultWebhookBackoff)
	}
	if c.WebhookBackoffMax > 24*time.Hour {
		add(EnvWebhookBackoffMax, "is %s: the longest wait between retries must be at most 24h (default %s)", c.WebhookBackoffMax, DefaultWebhookBackoffMax)
	}
	if c.WebhookRetention < time.Minute || c.WebhookRetention > 365*24*time.Hour {
		add(EnvWebhookRetention, "is %s: ended webhook deliveries must be kept between 1m and 8760h (default %s)", c.WebhookRetention, DefaultWebhookRetention)
	}

	if len(ps) > 0 {
		return ps
	}
	return nil
}

func checkListenAddr(addr string) error {
	if addr == "" {
		return fmt.Errorf("is empty")
	}
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("is not host:port")
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 0 || n > 65535 {
		return fmt.Errorf("has an invalid port")
	}
	return nil
}

// LoopbackAddr reports whether a listen address can only be reached from this
// host: its host is a loopback IP or "localhost". An empty host (":8080")
// listens on every interface.
func LoopbackAddr(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func checkOrigin(o string) error {
	if o == "*" {
		return nil
	}
	u, err := url.Parse(o)
	if err != nil {
		return fmt.Errorf("is not a URL")
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return fmt.Errorf("needs an http or https scheme")
	}
	if u.Host == "" || u.User != nil || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" {
		return fmt.Errorf("is not a bare origin")
	}
	return nil
}

// RedactURL masks the password of a URL so it can appear in logs and error
// messages. Strings that are not URLs (key=value DSNs) have their
// password=... value masked instead.
func RedactURL(s string) string {
	return redactQueryPasswords(redactUserinfo(s))
}

// queryPassword matches password options in a URL's query
// (password=, sentinel_password=).
var queryPassword = regexp.MustCompile(`([?&](?:sentinel_)?password=)[^&]*`)

func redactQueryPasswords(s string) string {
	if !strings.Contains(s, "://") {
		return s
	}
	return queryPassword.ReplaceAllString(s, "${1}xxxxx")
}

func redactUserinfo(s string) string {
	if u, err := url.Parse(s); err == nil && u.Scheme != "" && u.User != nil {
		if _, has := u.User.Password(); has {
			u.User = url.UserPassword(u.User.Username(), "xxxxx")
		}
		return u.String()
	}
	if strings.Contains(s, "password=") {
		fields := strings.Fields(s)
		for i, f := range fields {
			if strings.HasPrefix(f, "password=") {
				fields[i] = "password=xxxxx"
			}
		}
		return strings.Join(fields, " ")
	}
	return redactClusterURL(s)
}

// redactClusterURL handles "redis-cluster://user:pass@h1:p1,h2:p2", which
// net/url refuses to parse because of the host list.
func redactClusterURL(s string) string {
	scheme, rest, ok := strings.Cut(s, "://")
	if !ok {
		return s
	}
	at := strings.LastIndex(rest, "@")
	if at < 0 {
		return s
	}
	user, _, hasPass := strings.Cut(rest[:at], ":")
	if !hasPass {
		return s
	}
	return scheme + "://" + user + ":xxxxx" + rest[at:]
}
