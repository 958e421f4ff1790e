// Package config turns Dropline's environment variables into one typed,
// validated Config. It is loaded once, in cmd/dropline, and its parts are
// passed down; nothing else in the program reads the environment.
//
// Every variable has a default that works with the quick start (`make run`
// against the services `make services` starts), so an empty environment plus
// DROPLINE_DEV=1 is a complete development setup.
package config

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/dropline/dropline/internal/clientaddr"
	"github.com/dropline/dropline/internal/tracing"
	"github.com/dropline/dropline/inventory"
	"github.com/dropline/dropline/live"
	"github.com/dropline/dropline/resolvers"
	"github.com/dropline/dropline/server"
	"github.com/dropline/dropline/server/graphql"
	"github.com/dropline/dropline/worker"
)

// Environment variable names. They are exported so that error messages,
// documentation and tests spell them the same way.
const (
	EnvRedisURL          = "REDIS_URL"
	EnvRedisClusterAddrs = "REDIS_CLUSTER_ADDRS"
	EnvDatabaseURL       = "DATABASE_URL"
	EnvAddr              = "DROPLINE_ADDR"
	EnvJWTSecret         = "DROPLINE_JWT_SECRET" //nolint:gosec // the variable name, not a credential
	EnvJWTIssuer         = "DROPLINE_JWT_ISSUER"
	EnvJWTAudience       = "DROPLINE_JWT_AUDIENCE"
	EnvJWTMaxLifetime    = "DROPLINE_JWT_MAX_LIFETIME"
	EnvDev               = "DROPLINE_DEV"
	EnvDevAllowRemote    = "DROPLINE_DEV_ALLOW_REMOTE"
	EnvKeyPrefix         = "DROPLINE_KEY_PREFIX"
	EnvHoldDefault       = "DROPLINE_HOLD_DEFAULT"
	EnvHoldMax           = "DROPLINE_HOLD_MAX"
	EnvHoldExtensions    = "DROPLINE_HOLD_EXTENSIONS"
	EnvMutationRate      = "DROPLINE_MUTATION_RATE"
	EnvLeaseTTL          = "DROPLINE_LEASE_TTL"
	EnvRejectionTTL      = "DROPLINE_REJECTION_TTL"
	EnvWaitlistMax       = "DROPLINE_WAITLIST_MAX"
	EnvMutationBurst     = "DROPLINE_MUTATION_BURST"
	EnvCostLimit         = "DROPLINE_COST_LIMIT"
	EnvCostRate          = "DROPLINE_COST_RATE"
	EnvCostBurst         = "DROPLINE_COST_BURST"
	EnvResponseMaxBytes  = "DROPLINE_RESPONSE_MAX_BYTES"
	EnvCORSOrigins       = "DROPLINE_CORS_ORIGINS"
	EnvShutdownTimeout   = "DROPLINE_SHUTDOWN_TIMEOUT"
	EnvLogLevel          = "DROPLINE_LOG_LEVEL"
	EnvLogFormat         = "DROPLINE_LOG_FORMAT"

	EnvRedisWaitReplicas  = "DROPLINE_REDIS_WAIT_REPLICAS"
	EnvRedisWaitTimeout   = "DROPLINE_REDIS_WAIT_TIMEOUT"
	EnvTrustedProxies     = "DROPLINE_TRUSTED_PROXIES"
	EnvClientAddrHeader   = "DROPLINE_CLIENT_ADDR_HEADER"
	EnvStreamConnsPerIP   = "DROPLINE_STREAM_CONNS_PER_IP"
	EnvStreamConnsPerPrin = "DROPLINE_STREAM_CONNS_PER_PRINCIPAL"
	EnvStreamSubsPerConn  = "DROPLINE_STREAM_SUBS_PER_CONN"
	EnvStreamMessageBytes = "DROPLINE_STREAM_MESSAGE_BYTES"
	EnvStreamInitTimeout  = "DROPLINE_STREAM_INIT_TIMEOUT"
	EnvStreamPingInterval = "DROPLINE_STREAM_PING_INTERVAL"
	EnvStreamWriteTimeout = "DROPLINE_STREAM_WRITE_TIMEOUT"
	EnvLiveInterval       = "DROPLINE_LIVE_INTERVAL"
	EnvAPQBytesPerAddr    = "DROPLINE_APQ_BYTES_PER_ADDR"
	EnvTrustedDocuments   = "DROPLINE_TRUSTED_DOCUMENTS"
	EnvSubgraph           = "DROPLINE_SUBGRAPH"
	EnvBodyTimeout        = "DROPLINE_BODY_TIMEOUT"
	EnvRequestsPerAddr    = "DROPLINE_REQUESTS_PER_ADDR"
	EnvGateSlots          = "DROPLINE_GATE_SLOTS"
	EnvGateWait           = "DROPLINE_GATE_WAIT"

	EnvWebhookTimeout     = "DROPLINE_WEBHOOK_TIMEOUT"
	EnvWebhookConcurrency = "DROPLINE_WEBHOOK_CONCURRENCY"
	EnvWebhookMaxAttempts = "DROPLINE_WEBHOOK_MAX_ATTEMPTS"
	EnvWebhookBackoff     = "DROPLINE_WEBHOOK_BACKOFF"
	EnvWebhookBackoffMax  = "DROPLINE_WEBHOOK_BACKOFF_MAX"
	EnvWebhookRetention   = "DROPLINE_WEBHOOK_RETENTION"

	EnvAdminAddr        = "DROPLINE_ADMIN_ADDR"
	EnvAdminAllowRemote = "DROPLINE_ADMIN_ALLOW_REMOTE"
	EnvMetricsListener  = "DROPLINE_METRICS_LISTENER"

	// The standard OpenTelemetry variables that turn traces on (Traces);
	// the exporter reads the others (headers, sampler, resource) itself.
	EnvOTLPEndpoint       = "OTEL_EXPORTER_OTLP_ENDPOINT"
	EnvOTLPTracesEndpoint = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"

	// EnvTestCartPause is for the fault tests only (see TestCartPause).
	EnvTestCartPause = "DROPLINE_TEST_CART_PAUSE"
	// EnvTestDrawPause is for the fault tests only (see TestDrawPause).
	EnvTestDrawPause = "DROPLINE_TEST_DRAW_PAUSE"
)

// Defaults, exported so the README table and the tests can refer to them.
// Those of settings a package owns are that package's defaults.
const (
	DefaultRedisURL         = "redis://127.0.0.1:6379/0"
	DefaultDatabaseURL      = "postgres://postgres@127.0.0.1:5432/dropline?sslmode=disable"
	DefaultAddr             = ":8080"
	DefaultDevAddr          = "127.0.0.1:8080"
	DefaultKeyPrefix        = inventory.DefaultKeyPrefix
	DefaultHoldDefault      = inventory.DefaultHoldDuration
	DefaultHoldMax          = inventory.DefaultMaxHold
	DefaultHoldExtensions   = inventory.DefaultMaxExtensions
	DefaultLeaseTTL         = worker.DefaultLeaseTTL
	DefaultRejectionTTL     = inventory.DefaultRejectionTTL
	DefaultMutationRate     = resolvers.DefaultMutationRate
	DefaultMutationBurst    = resolvers.DefaultMutationBurst
	DefaultCostLimit        = graphql.DefaultComplexity
	DefaultCostRate         = graphql.DefaultCostRate
	DefaultCostBurst        = graphql.DefaultCostBurst
	DefaultResponseMaxBytes = graphql.DefaultResponseBytes
	DefaultWaitlistMax      = inventory.DefaultWaitlistMax
	DefaultShutdownTimeout  = 15 * time.Second
	DefaultJWTMaxLifetime   = 24 * time.Hour
	DefaultLogLevel         = "info"

	DefaultRedisWaitTimeout   = inventory.DefaultWaitTimeout
	DefaultClientAddrHeader   = string(clientaddr.XForwardedFor)
	DefaultStreamConnsPerIP   = graphql.DefaultConnsPerIP
	DefaultStreamConnsPerPrin = graphql.DefaultConnsPerPrincipal
	DefaultStreamSubsPerConn  = graphql.DefaultSubscriptionsPerConn
	DefaultStreamMessageBytes = graphql.DefaultMessageBytes
	DefaultStreamInitTimeout  = graphql.DefaultInitTimeout
	DefaultStreamPingInterval = graphql.DefaultPingInterval
	DefaultStreamWriteTimeout = graphql.DefaultWriteTimeout
	DefaultLiveInterval       = live.DefaultInterval
	DefaultAPQBytesPerAddr    = graphql.DefaultAPQBytesPerAddr
	DefaultBodyTimeout        = server.DefaultBodyTimeout
	DefaultRequestsPerAddr    = server.DefaultRequestsPerAddr
	DefaultGateWait           = graphql.DefaultGateWait
	GateSlotsPerCPU           = graphql.GateSlotsPerCPU

	DefaultWebhookTimeout     = worker.DefaultWebhookTimeout
	DefaultWebhookConcurrency = worker.DefaultWebhookConcurrency
	DefaultWebhookMaxAttempts = worker.DefaultWebhookMaxAttempts
	DefaultWebhookBackoff     = worker.DefaultWebhookBackoff
	DefaultWebhookBackoffMax  = worker.DefaultWebhookBackoffMax
	DefaultWebhookRetention   = worker.DefaultWebhookRetention

	// DevOrigin is the origin the playground is served from by `make run`;
	// dev mode allows it for CORS in addition to DROPLINE_CORS_ORIGINS.
	DevOrigin = "http://localhost:8080"

	// DevJWTSecret signs tokens only in dev mode, when DROPLINE_JWT_SECRET is
	// empty. It is public (it is in the source), so anyone can forge tokens
	// for a server that uses it: Validate refuses it outside dev mode.
	DevJWTSecret = "dropline-development-secret-do-not-use-in-production"

	// MinJWTSecretLen is the shortest accepted HS256 secret, in bytes: HMAC
	// keys shorter than the hash output (32 bytes for SHA-256) weaken it.
	MinJWTSecretLen = 32
)

// Log formats accepted by DROPLINE_LOG_FORMAT.
const (
	LogFormatJSON    = "json"
	LogFormatConsole = "console"
)

// Config is everything Dropline reads from its environment. The zero value
// is not useful: build it with Load (or Default) and check it with Validate.
type Config struct {
	// RedisURL locates Redis (REDIS_URL).
	// Default: "redis://127.0.0.1:6379/0".
	// Forms: "redis://[user:pass@]host:port/db[?options]" and "rediss://..."
	// for TLS (options as go-redis ParseURL accepts them);
	// "redis-cluster://[user:pass@]h1:p1,h2:p2[?options]" (or
	// "rediss-cluster://") selects Redis Cluster mode with those seed nodes.
	RedisURL string

	// RedisClusterAddrs selects Redis Cluster mode with these seed nodes
	// (REDIS_CLUSTER_ADDRS, comma separated "host:port" list).
	// Default: empty, which means "use RedisURL as it is". When set, the
	// nodes replace the host(s) of RedisURL; the credentials and options of
	// RedisURL still apply, and its database number must be 0.
	RedisClusterAddrs []string

	// DatabaseURL locates the PostgreSQL ledger (DATABASE_URL), in any form
	// pgx accepts (URL or "key=value" DSN).
	// Default: "postgres://postgres@127.0.0.1:5432/dropline?sslmode=disable",
	// which matches what `make services` starts.
	DatabaseURL string

	// Addr is the HTTP listen address (DROPLINE_ADDR).
	// Default: ":8080", or "127.0.0.1:8080" in dev mode. Port 0 picks a free
	// port (used by end-to-end tests; the bound address is reported by
	// App.Addr). In dev mode it must be a loopback address (127.0.0.0/8, ::1,
	// localhost) unless DevAllowRemote is set: dev mode signs tokens with a
	// public secret, so whoever reaches the port can mint an admin token.
	Addr string

	// JWTSecret is the HS256 key for bearer tokens (DROPLINE_JWT_SECRET),
	// at least MinJWTSecretLen bytes. Never logged.
	// Default: empty, which is an error unless Dev is set, in which case
	// DevJWTSecret is used and a warning is printed (see JWTKey).
	JWTSecret string

	// JWTIssuer, when set, is the "iss" every token must carry
	// (DROPLINE_JWT_ISSUER); `dropline token` writes it. Default: empty, which
	// accepts any issuer (and mints "dropline").
	JWTIssuer string

	// JWTAudience, when set, must be among every token's "aud"
	// (DROPLINE_JWT_AUDIENCE); `dropline token` writes it. Default: empty,
	// which checks no audience.
	JWTAudience string

	// JWTMaxLifetime, when positive, refuses tokens valid for longer: whose
	// exp - iat, or exp - now, exceeds it (DROPLINE_JWT_MAX_LIFETIME, e.g.
	// "12h"). `dropline token --ttl` must stay within it. Default: 24h, so
	// a leaked token is not a standing credential (a token that says it
	// lasts until the year 9999 is refused); 0 turns the limit off.
	JWTMaxLifetime time.Duration

	// Dev enables development mode (DROPLINE_DEV: 1/true/yes/on).
	// Default: false. Dev mode allows the built-in DevJWTSecret, enables
	// GraphQL introspection, allows DevOrigin for CORS, defaults the log
	// format to "console", serves POST /dev/token (buyer tokens for the demo
	// shop's sign-in), listens on loopback only (see Addr) and answers only
	// requests whose Host is a loopback name (localhost, 127.0.0.1, [::1]),
	// so a web page cannot reach it by rebinding a name of its own to
	// 127.0.0.1.
	Dev bool

	// DevAllowRemote lets dev mode listen on a non-loopback address
	// (DROPLINE_DEV_ALLOW_REMOTE: 1/true/yes/on). Default: false. Only for a
	// network nobody else can reach, such as inside a container whose port is
	// published on the host's loopback: with the built-in secret, anyone who
	// reaches the port can mint an admin token.
	DevAllowRemote bool

	// KeyPrefix starts every Redis key Dropline writes (DROPLINE_KEY_PREFIX),
	// so several deployments or tests can share one Redis.
	// Default: "dl:". Must not contain '{' or '}' (the key layout owns the
	// hash tags) nor whitespace; at most 64 bytes.
	KeyPrefix string

	// HoldDefault is how long a reservation is held when the client does not
	// ask for a duration (DROPLINE_HOLD_DEFAULT).
	// Default: 600s. Accepts Go durations ("10m") or whole seconds ("600").
	HoldDefault time.Duration

	// HoldMax bounds the hold duration a client may ask for
	// (DROPLINE_HOLD_MAX). Default: 3600s. Must be >= HoldDefault and <= 24h.
	HoldMax time.Duration

	// HoldExtensions is how many times the holder may extend a reservation
	// (extendReservation) (DROPLINE_HOLD_EXTENSIONS). Default: 2; between 0
	// (no extensions) and 100. However often it is extended, a hold never
	// lasts past HoldMax after it was made.
	HoldExtensions int

	// LeaseTTL is how long a worker lease on a partition lasts without
	// renewal (DROPLINE_LEASE_TTL). Default: 10s, at least 1s. When an
	// instance dies, its partitions' write-behind and commit reconciliation
	// move to the others after at most about this long (expiry does not
	// wait: any live instance sweeps a partition whose holds are overdue);
	// shorter means faster failover and more Redis traffic (renewals every
	// third of it).
	LeaseTTL time.Duration

	// TestCartPause makes every cart wait at one of its steps
	// (DROPLINE_TEST_CART_PAUSE, "held:30s" or "confirmed:30s": after every
	// line is held provisionally, or after the first partition's lines are
	// confirmed). Test only: the fault suite sets it to kill a server in the
	// middle of a cart. Default: none; the time is 0 to 1m. Never set it in a
	// deployment: carts would fail.
	TestCartPause inventory.CartPause

	// TestDrawPause makes every draw wait once at one of its steps
	// (DROPLINE_TEST_DRAW_PAUSE, "decided:30s" or "applied:30s": after its
	// result is computed inside its Postgres transaction, before the commit,
	// or after the first batch of its result is written to Redis). Test
	// only: the fault suite sets it to kill a server in the middle of a draw.
	// Default: none; the time is 0 to 1m. Never set it in a deployment:
	// draws would be late.
	TestDrawPause inventory.DrawPause

	// RejectionTTL is how long a refused reserve (out of stock, over the
	// quota, sale not open) replays for its idempotency key
	// (DROPLINE_REJECTION_TTL). Default: 5m; between 1s and 24h. Redis keeps
	// each such rejection (about 530 bytes with its key's claim and Redis'
	// per-key overhead; a refused cart at most about 640 per line) this
	// long, so one principal can make Redis keep at most about
	// (MutationRate x RejectionTTL + MutationBurst) x 640 bytes: 2 MB with
	// the defaults. A hold replays for 24h whatever this says.
	RejectionTTL time.Duration

	// WaitlistMax is how many principals may wait on one SKU at once
	// (DROPLINE_WAITLIST_MAX); a join beyond it is refused WAITLIST_FULL.
	// Default: 10000; between 1 and 100000. A release that no waiter can
	// take walks the whole queue inside its script, so this bounds that
	// script's time as well as the queue's memory.
	WaitlistMax int

	// MutationRate is how many mutations per second one principal may send
	// on average (DROPLINE_MUTATION_RATE), enforced in Redis (GCRA) so it
	// holds across instances. Default: 10. A negative value turns the limit
	// off (load tests); 0 is refused.
	MutationRate int

	// MutationBurst is how many mutations a principal may send at once
	// before the rate applies (DROPLINE_MUTATION_BURST); a cart counts one
	// per line, so it is at least 50, the most lines of a cart. Default: 50.
	MutationBurst int

	// CostLimit is the most one operation may cost (DROPLINE_COST_LIMIT):
	// one per field, a list's selection times the most items the list can
	// return. Default: 2000; at least 100. Over it, an operation is
	// refused before it runs.
	CostLimit int

	// CostRate and CostBurst are each caller's budget of cost points
	// (DROPLINE_COST_RATE, DROPLINE_COST_BURST): one per signed-in
	// principal and one per client address for anonymous requests, kept in
	// each instance. A budget holds CostBurst points and gets CostRate
	// back per second; every query and mutation spends its cost. Defaults:
	// 1000 and 10000. A negative CostRate turns the budgets off; 0 is
	// refused; CostBurst must be at least CostLimit.
	CostRate  int
	CostBurst int

	// ResponseMaxBytes bounds one response (DROPLINE_RESPONSE_MAX_BYTES):
	// a response growing past it stops being built and is answered
	// RESPONSE_TOO_LARGE. Default: 1048576 (1 MiB); 1024 to 67108864.
	ResponseMaxBytes int

	// CORSOrigins lists the browser origins allowed to call the API from
	// another origin (DROPLINE_CORS_ORIGINS, comma separated, e.g.
	// "https://shop.example.com,https://admin.example.com"; "*" allows any).
	// Default: empty, meaning same-origin only. Dev mode adds DevOrigin
	// (see AllowedOrigins).
	CORSOrigins []string

	// ShutdownTimeout bounds graceful shutdown after SIGINT/SIGTERM
	// (DROPLINE_SHUTDOWN_TIMEOUT): in-flight requests, workers and pools get
	// this long in total before the process exits anyway. Default: 15s.
	ShutdownTimeout time.Duration

	// LogLevel is the minimum zerolog level (DROPLINE_LOG_LEVEL: trace,
	// debug, info, warn, error, fatal, panic, disabled). Default: "info".
	LogLevel string

	// LogFormat is "json" (one JSON object per line, for collectors) or
	// "console" (coloured, for humans) (DROPLINE_LOG_FORMAT).
	// Default: "json", or "console" in dev mode.
	LogFormat string

	// RedisWaitReplicas, when positive, makes each reserve and each
	// commit's last Redis step wait until that many replicas have the write
	// before answering (DROPLINE_REDIS_WAIT_REPLICAS), which narrows what a
	// failover can lose. Default: 0, no wait. Needs a single primary
	// (redis:// or redis-sentinel://), not a cluster.
	RedisWaitReplicas int

	// RedisWaitTimeout bounds each such wait (DROPLINE_REDIS_WAIT_TIMEOUT).
	// Default: 50ms; between 1ms and 1s. When it runs out, the answer is
	// given anyway and dropline_redis_wait_short_total counts it: slow
	// replicas never turn a made hold into an error.
	RedisWaitTimeout time.Duration

	// TrustedProxies lists the peers whose forwarding header is believed
	// (DROPLINE_TRUSTED_PROXIES, comma separated CIDRs or addresses, e.g.
	// "127.0.0.1,10.0.0.0/8,fd00::/8"). Default: empty, trusting no one: the
	// client address is the TCP peer. Behind a load balancer, list its
	// addresses, or every client shares the balancer's per-address caps.
	// The client is the rightmost hop of the header that is not in the list.
	TrustedProxies []string

	// ClientAddrHeader is the forwarding header read from trusted proxies
	// (DROPLINE_CLIENT_ADDR_HEADER): "x-forwarded-for" or "forwarded"
	// (RFC 7239). Default: "x-forwarded-for". Only one is read: the other
	// arrives untouched from the client and could name any address.
	ClientAddrHeader string

	// StreamConnsPerIP caps the open websocket and SSE connections of one
	// client address, IPv6 counted per /64 (DROPLINE_STREAM_CONNS_PER_IP).
	// Default: 256, per instance.
	StreamConnsPerIP int

	// StreamConnsPerPrincipal caps the open stream connections of one
	// signed-in principal (DROPLINE_STREAM_CONNS_PER_PRINCIPAL). Default:
	// 32, per instance.
	StreamConnsPerPrincipal int

	// StreamSubsPerConn caps the operations in flight on one websocket:
	// its subscriptions, and its queries and mutations until they are
	// answered (DROPLINE_STREAM_SUBS_PER_CONN). Default: 32.
	StreamSubsPerConn int

	// StreamMessageBytes caps a message a websocket client sends
	// (DROPLINE_STREAM_MESSAGE_BYTES). Default: 65536; between 1024 and
	// 1048576.
	StreamMessageBytes int

	// StreamInitTimeout is how long a websocket may take to send
	// connection_init (DROPLINE_STREAM_INIT_TIMEOUT). Default: 3s.
	StreamInitTimeout time.Duration

	// StreamPingInterval is how often websockets are pinged and SSE streams
	// get a keep-alive (DROPLINE_STREAM_PING_INTERVAL). Default: 15s; keep it
	// below the proxy's read timeout, or the proxy cuts quiet streams.
	StreamPingInterval time.Duration

	// StreamWriteTimeout bounds each websocket write; a client too slow to
	// take a message within it is disconnected
	// (DROPLINE_STREAM_WRITE_TIMEOUT). Default: 10s.
	StreamWriteTimeout time.Duration

	// LiveInterval bounds the pacing of one SKU's stock to live subscribers
	// (DROPLINE_LIVE_INTERVAL). Pacing is self-clocked: a change goes out
	// at once when the SKU's previous value has reached every subscriber
	// (and a fifth of the interval has passed since it went out, more when
	// that fan-out took long), else the newest goes out as soon as it has;
	// a change never waits more than the interval for a slow subscriber.
	// Default: 100ms; between 1ms and 1s. Shorter is fresher and costs
	// more CPU while a watched SKU changes fast (a write per watcher per
	// delivery).
	LiveInterval time.Duration

	// WebhookTimeout bounds one delivery attempt to one webhook endpoint
	// (DROPLINE_WEBHOOK_TIMEOUT). Default: 10s; between 100ms and 1m.
	WebhookTimeout time.Duration
	// WebhookConcurrency is how many deliveries one process sends to one
	// endpoint at once, each of another product
	// (DROPLINE_WEBHOOK_CONCURRENCY). Default: 4; between 1 and 64.
	WebhookConcurrency int
	// WebhookMaxAttempts is how many attempts a delivery gets before it is a
	// dead letter (DROPLINE_WEBHOOK_MAX_ATTEMPTS). Default: 12; between 1
	// and 100.
	WebhookMaxAttempts int
	// WebhookBackoff and WebhookBackoffMax bound the wait before a retry,
	// which doubles per failed attempt (DROPLINE_WEBHOOK_BACKOFF,
	// DROPLINE_WEBHOOK_BACKOFF_MAX). Defaults: 1s and 1h.
	WebhookBackoff    time.Duration
	WebhookBackoffMax time.Duration
	// WebhookRetention is how long a delivery that ended (delivered, or a
	// dead letter nobody redelivered) and its event are kept before the
	// dispatcher deletes them (DROPLINE_WEBHOOK_RETENTION). Default: 168h
	// (7 days); between 1m and 8760h.
	WebhookRetention time.Duration

	// APQBytesPerAddr is how many bytes of automatic persisted queries one
	// client address (IPv6 per /64) may have registered in Redis
	// (DROPLINE_APQ_BYTES_PER_ADDR), counted until 24 h after its last
	// registration; beyond it a query still runs but is not registered,
	// and its client keeps sending it whole. Default: 1048576; between 65536
	// and 1073741824. A query is registered only once it has run, and only
	// up to 32 KiB.
	APQBytesPerAddr int

	// TrustedDocuments is the path of a manifest of the only documents the
	// server runs (DROPLINE_TRUSTED_DOCUMENTS): Apollo's persisted query
	// manifest, or the map of id to document Relay's compiler and
	// graphql-codegen's client preset write. Clients name a document by its
	// id (extensions.persistedQuery.sha256Hash, documentId or doc_id);
	// anything else is refused with PERSISTED_QUERY_NOT_ALLOWED, except a
	// document sent as text in dev mode (the playground), and automatic
	// persisted queries are off. Default: empty, meaning any document runs.
	TrustedDocuments string

	// Subgraph makes the server an Apollo Federation v2 subgraph
	// (DROPLINE_SUBGRAPH: 1/true/yes/on): it answers _service { sdl } and
	// _entities for a gateway. Default: false, and both are refused, since
	// the SDL maps the schema as introspection (off outside dev mode) would.
	Subgraph bool

	// BodyTimeout bounds how long a client may take to send a request's
	// body once its headers are in (DROPLINE_BODY_TIMEOUT); a slower body
	// gets 408 and its connection is closed. Default: 10s; between 1s and
	// 1m.
	BodyTimeout time.Duration

	// RequestsPerAddr caps the requests in flight from one client address,
	// IPv6 counted per /64 (DROPLINE_REQUESTS_PER_ADDR); one more gets 429
	// with Retry-After at once. Websocket and SSE streams are capped by
	// StreamConnsPerIP instead. Default: 1024, per instance; at least 1.
	RequestsPerAddr int

	// GateSlots is how many queries and mutations that are not money run
	// at once in one instance (DROPLINE_GATE_SLOTS); the others wait for a
	// slot in the order they came. Commits and cancels (commit, commitCart,
	// cancel, cancelCart) skip the wait, so a paying buyer is not queued
	// behind a sold-out storm of reserves. Default: 0, no gate (a slot is
	// held while its operation waits for a loader or a reserve batch, which
	// costs ordinary traffic more than commits gain; docs/design.md); between
	// 1 and 4096, 8 per core the process runs on (GOMAXPROCS) to start from.
	GateSlots int

	// GateWait is the longest an operation waits for a slot of the gate
	// (DROPLINE_GATE_WAIT); one that waited longer is answered SERVER_BUSY,
	// to retry. Default: 10s; between 100ms and 1m.
	GateWait time.Duration

	// AdminAddr, when set, opens a second listener for operators with the Go
	// profiler (net/http/pprof under /debug/pprof/) and a /readyz that names
	// each failure, which the public one does not (DROPLINE_ADMIN_ADDR,
	// host:port). Default: empty, no admin listener. It must be a loopback
	// address (127.0.0.0/8, ::1, localhost) unless AdminAllowRemote is set:
	// a profile shows the program's internals and costs CPU while it runs,
	// and the listener has no authentication.
	AdminAddr string

	// AdminAllowRemote lets AdminAddr be a non-loopback address
	// (DROPLINE_ADMIN_ALLOW_REMOTE: 1/true/yes/on). Default: false. Only
	// behind a firewall that lets nobody but operators reach the port.
	AdminAllowRemote bool

	// MetricsListener says which listener serves /metrics
	// (DROPLINE_METRICS_LISTENER): MetricsPublic, the API's own port, or
	// MetricsAdmin, the admin listener only (AdminAddr must then be set).
	// Default: MetricsPublic, so that an existing scrape keeps working and
	// a deployment without an admin listener still has metrics. The sales
	// and reserve rates it shows are business data: where clients reach
	// the API port directly, serve them on the admin listener.
	MetricsListener string

	// Traces is whether OpenTelemetry traces are exported: set by Load
	// when OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT
	// is set (and OTEL_SDK_DISABLED or OTEL_TRACES_EXPORTER=none do not
	// turn it off; see internal/tracing). The exporter reads its other
	// settings from the standard OTEL_* variables itself. Default: false,
	// and then no span is made at all.
	Traces bool
}

// The listeners /metrics can be served on (Config.MetricsListener).
const (
	MetricsPublic = "public"
	MetricsAdmin  = "admin"
)

// Load reads the configuration through getenv (os.Getenv in main, a map in
// tests). Unset or empty variables keep their defaults. It fails only on
// values it cannot parse (a bad duration or boolean); semantic checks are
// Validate's job, so callers run both.
func Load(getenv func(string) string) (Config, error) {
	c := Default()
	var problems Problems

	str := func(name string, dst *string) {
		if v := strings.TrimSpace(getenv(name)); v != "" {
			*dst = v
		}
	}
	num := func(name string, dst *int) {
		v := strings.TrimSpace(getenv(name))
		if v == "" {
			return
		}
		n, err := strconv.Atoi(v)
		if err != nil {
			problems = append(problems, Problem{Var: name, Msg: fmt.Sprintf("%q is not a whole number", v)})
			return
		}
		*dst = n
	}
	dur := func(name string, dst *time.Duration) {
		v := strings.TrimSpace(getenv(name))
		if v == "" {
			return
		}
		d, err := parseDuration(v)
		if err != nil {
			problems = append(problems, Problem{Var: name, Msg: fmt.Sprintf("%q is not a duration: use a Go duration such as \"90s\" or \"10m\", or whole seconds", v)})
			return
		}
		*dst = d
	}

	str(EnvRedisURL, &c.RedisURL)
	c.RedisClusterAddrs = splitList(getenv(EnvRedisClusterAddrs))
	str(EnvDatabaseURL, &c.DatabaseURL)
	// The secret is taken verbatim: surrounding spaces are part of it.
	c.JWTSecret = getenv(EnvJWTSecret)
	str(EnvJWTIssuer, &c.JWTIssuer)
	str(EnvJWTAudience, &c.JWTAudience)
	dur(EnvJWTMaxLifetime, &c.JWTMaxLifetime)
	boolean := func(name string, dst *bool) {
		if v := strings.TrimSpace(getenv(name)); v != "" {
			b, err := parseBool(v)
			if err != nil {
				problems = append(problems, Problem{Var: name, Msg: fmt.Sprintf("%q is not a boolean: use 1/true/yes/on or 0/false/no/off", v)})
			}
			*dst = b
		}
	}
	boolean(EnvDev, &c.Dev)
	boolean(EnvDevAllowRemote, &c.DevAllowRemote)
	if c.Dev {
		c.Addr = DefaultDevAddr
	}
	str(EnvAddr, &c.Addr)
	str(EnvKeyPrefix, &c.KeyPrefix)
	dur(EnvHoldDefault, &c.HoldDefault)
	dur(EnvHoldMax, &c.HoldMax)
	num(EnvHoldExtensions, &c.HoldExtensions)
	dur(EnvLeaseTTL, &c.LeaseTTL)
	dur(EnvRejectionTTL, &c.RejectionTTL)
	num(EnvWaitlistMax, &c.WaitlistMax)
	if v := getenv(EnvTestCartPause); v != "" {
		at, d, ok := strings.Cut(v, ":")
		c.TestCartPause.At = at
		var err error
		if c.TestCartPause.For, err = time.ParseDuration(d); !ok || err != nil {
			problems = append(problems, Problem{Var: EnvTestCartPause, Msg: fmt.Sprintf("%q: want held:<duration> or confirmed:<duration>", v)})
		}
	}
	if v := getenv(EnvTestDrawPause); v != "" {
		at, d, ok := strings.Cut(v, ":")
		c.TestDrawPause.At = at
		var err error
		if c.TestDrawPause.For, err = time.ParseDuration(d); !ok || err != nil {
			problems = append(problems, Problem{Var: EnvTestDrawPause, Msg: fmt.Sprintf("%q: want decided:<duration> or applied:<duration>", v)})
		}
	}
	num(EnvMutationRate, &c.MutationRate)
	num(EnvMutationBurst, &c.MutationBurst)
	num(EnvCostLimit, &c.CostLimit)
	num(EnvCostRate, &c.CostRate)
	num(EnvCostBurst, &c.CostBurst)
	num(EnvResponseMaxBytes, &c.ResponseMaxBytes)
	c.CORSOrigins = splitList(getenv(EnvCORSOrigins))
	dur(EnvShutdownTimeout, &c.ShutdownTimeout)
	str(EnvLogLevel, &c.LogLevel)
	c.LogLevel = strings.ToLower(c.LogLevel)
	if v := strings.ToLower(strings.TrimSpace(getenv(EnvLogFormat))); v != "" {
		c.LogFormat = v
	} else if c.Dev {
		c.LogFormat = LogFormatConsole
	}

	num(EnvRedisWaitReplicas, &c.RedisWaitReplicas)
	dur(EnvRedisWaitTimeout, &c.RedisWaitTimeout)
	c.TrustedProxies = splitList(getenv(EnvTrustedProxies))
	if v := strings.ToLower(strings.TrimSpace(getenv(EnvClientAddrHeader))); v != "" {
		c.ClientAddrHeader = v
	}
	num(EnvStreamConnsPerIP, &c.StreamConnsPerIP)
	num(EnvStreamConnsPerPrin, &c.StreamConnsPerPrincipal)
	num(EnvStreamSubsPerConn, &c.StreamSubsPerConn)
	num(EnvStreamMessageBytes, &c.StreamMessageBytes)
	dur(EnvStreamInitTimeout, &c.StreamInitTimeout)
	dur(EnvStreamPingInterval, &c.StreamPingInterval)
	dur(EnvStreamWriteTimeout, &c.StreamWriteTimeout)
	dur(EnvLiveInterval, &c.LiveInterval)
	num(EnvAPQBytesPerAddr, &c.APQBytesPerAddr)
	str(EnvTrustedDocuments, &c.TrustedDocuments)
	boolean(EnvSubgraph, &c.Subgraph)
	dur(EnvBodyTimeout, &c.BodyTimeout)
	num(EnvRequestsPerAddr, &c.RequestsPerAddr)
	num(EnvGateSlots, &c.GateSlots)
	dur(EnvGateWait, &c.GateWait)
	dur(EnvWebhookTimeout, &c.WebhookTimeout)
	num(EnvWebhookConcurrency, &c.WebhookConcurrency)
	num(EnvWebhookMaxAttempts, &c.WebhookMaxAttempts)
	dur(EnvWebhookBackoff, &c.WebhookBackoff)
	dur(EnvWebhookBackoffMax, &c.WebhookBackoffMax)
	dur(EnvWebhookRetention, &c.WebhookRetention)
	str(EnvAdminAddr, &c.AdminAddr)
	boolean(EnvAdminAllowRemote, &c.AdminAllowRemote)
	if v := strings.ToLower(strings.TrimSpace(getenv(EnvMetricsListener))); v != "" {
		c.MetricsListener = v
	}
	c.Traces = tracing.Enabled(getenv)

	if len(problems) > 0 {
		return c, problems
	}
	return c, nil
}
