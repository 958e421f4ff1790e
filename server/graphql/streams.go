package graphql

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vektah/gqlparser/v2/gqlerror"

	"github.com/dropline/dropline/internal/clientaddr"
	"github.com/dropline/dropline/internal/header"
	"github.com/dropline/dropline/internal/prom"

	"github.com/dropline/dropline/auth"
	"github.com/dropline/dropline/resolvers"
)

// Defaults of StreamLimits, exported so the configuration documents and
// validates the same values.
const (
	DefaultConnsPerIP           = 256
	DefaultConnsPerPrincipal    = 32
	DefaultSubscriptionsPerConn = 32
	DefaultMessageBytes         = 64 << 10
	DefaultInitTimeout          = 3 * time.Second
	DefaultPingInterval         = 15 * time.Second
	DefaultWriteTimeout         = 10 * time.Second
)

// StreamLimits bound live subscriptions, over websockets and SSE. Each zero
// value takes the default named on the field.
type StreamLimits struct {
	// ConnsPerIP caps the open websocket and SSE connections of one client
	// address: the address the server resolved (the TCP peer, or the
	// forwarded client address when the peer is a trusted proxy; see
	// internal/clientaddr). IPv6 clients count per /64, the block one
	// subscriber line usually gets. Over the cap the upgrade gets 429.
	// Default 256.
	ConnsPerIP int
	// ConnsPerPrincipal caps the open connections of one signed-in
	// principal. A websocket over the cap is closed with 4429 after
	// connection_init; an SSE request gets 429. Default 32.
	ConnsPerPrincipal int
	// SubscriptionsPerConn caps the operations in flight on one websocket:
	// its subscriptions, and the queries and mutations it sent that are not
	// answered yet. One more is refused before it runs, with
	// TOO_MANY_SUBSCRIPTIONS. Default 32.
	SubscriptionsPerConn int
	// MessageBytes caps a message read from a websocket client; a larger
	// one closes the connection with 1009. Default 64 KiB.
	MessageBytes int64
	// InitTimeout is how long a websocket may take to send connection_init.
	// Default 3 s.
	InitTimeout time.Duration
	// PingInterval is how often the server pings a graphql-transport-ws
	// client (one that leaves a ping unanswered for two intervals is
	// closed) and sends keep-alives to a legacy graphql-ws client or an SSE
	// stream. Default 15 s.
	PingInterval time.Duration
	// WriteTimeout bounds each websocket write. A client that reads too
	// slowly to take a message within it is disconnected, so it never
	// holds a goroutine or a subscription for ever. Default 10 s.
	WriteTimeout time.Duration
	// ReservationRecheck is how often reservationChanged re-reads its
	// reservation besides every stock change of its SKU. Default 1 s (see
	// resolvers.Config).
	ReservationRecheck time.Duration
}

func (l StreamLimits) withDefaults() StreamLimits {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	defDur := func(v *time.Duration, d time.Duration) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&l.ConnsPerIP, DefaultConnsPerIP)
	def(&l.ConnsPerPrincipal, DefaultConnsPerPrincipal)
	def(&l.SubscriptionsPerConn, DefaultSubscriptionsPerConn)
	if l.MessageBytes <= 0 {
		l.MessageBytes = DefaultMessageBytes
	}
	defDur(&l.InitTimeout, DefaultInitTimeout)
	defDur(&l.PingInterval, DefaultPingInterval)
	defDur(&l.WriteTimeout, DefaultWriteTimeout)
	return l
}

// Transports of a stream connection, as metric labels.
const (
	kindWebsocket = "websocket"
	kindSSE       = "sse"
)

// streamConn is what the handler knows about one websocket or SSE
// connection: the slots it holds in the tracker and its subscriptions. It
// travels in the request context from the tracker's middleware to the
// websocket adapter, the init func and the subscription resolvers (as a resolvers.Stream).
type streamConn struct {
	kind    string
	tracker *streamTracker
	ip      string           // the address slot it holds
	gauge   prometheus.Gauge // counts it while not nil

	subs atomic.Int32
	// kept says the connection outlives its handler (an SSE stream taken
	// from net/http): whoever took it ends it.
	kept atomic.Bool

	mu        sync.Mutex
	principal string    // holds a principal slot when not empty
	expiresAt time.Time // the token's expiry; zero when anonymous
	cancelExp context.CancelFunc
	closed    bool
}

type streamConnKey struct{}

func streamConnFrom(ctx context.Context) *streamConn {
	c, _ := ctx.Value(streamConnKey{}).(*streamConn)
	return c
}

// bindPrincipal takes a principal slot for the connection. It fails when
// the principal is at its cap or the connection already ended.
func (c *streamConn) bindPrincipal(p auth.Principal) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || c.principal != "" {
		return !c.closed
	}
	if !c.tracker.acquire(c.tracker.byPrincipal, p.ID, c.tracker.limits.ConnsPerPrincipal) {
		return false
	}
	c.principal = p.ID
	c.expiresAt = p.ExpiresAt
	return true
}

// expireAt ends ctx when the token expires, and remembers why, so the
// websocket is closed with 4403 rather than a normal closure.
func (c *streamConn) expireAt(ctx context.Context, at time.Time) context.Context {
	if at.IsZero() {
		return ctx
	}
	ctx, cancel := context.WithDeadlineCause(ctx, at, auth.ErrTokenExpired)
	c.mu.Lock()
	c.expiresAt = at
	c.cancelExp = cancel
	c.mu.Unlock()
	return ctx
}

// tokenExpired reports whether the connection's token has expired.
func (c *streamConn) tokenExpired() bool { return c.expiredAt(time.Now()) }

// expiredAt reports whether the connection's token has expired at now.
func (c *streamConn) expiredAt(now time.Time) bool {
	if c == nil {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return !c.expiresAt.IsZero() && !now.Before(c.expiresAt)
}

// end releases the connection's slots (its address's and its
// principal's), its count and the expiry timer; idempotent.
func (c *streamConn) end() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	c.closed = true
	c.tracker.release(c.tracker.byIP, c.ip)
	if c.principal != "" {
		c.tracker.release(c.tracker.byPrincipal, c.principal)
	}
	if c.gauge != nil {
		c.gauge.Dec()
	}
	if c.cancelExp != nil {
		c.cancelExp()
	}
}

// keep lets the connection outlive its handler: the handler's return no
// longer ends it, and whoever called keep calls the end returned, once
// the connection is gone. A nil connection (no tracker) has nothing to
// end.
func (c *streamConn) keep() (end func()) {
	if c == nil {
		return func() {}
	}
	c.kept.Store(true)
	return c.end
}

// handlerReturned ends the connection unless it was kept.
func (c *streamConn) handlerReturned() {
	if !c.kept.Load() {
		c.end()
	}
}

// AdmitOperation counts an operation in flight against the connection's
// SubscriptionsPerConn; the returned func gives it back.
func (c *streamConn) AdmitOperation() (release func(), ok bool) {
	if int(c.subs.Add(1)) > c.tracker.limits.SubscriptionsPerConn {
		c.subs.Add(-1)
		c.tracker.m.refused.WithLabelValues("subscription_limit").Inc()
		return nil, false
	}
	var once sync.Once
	return func() { once.Do(func() { c.subs.Add(-1) }) }, true
}

// Websocket reports whether the connection is a websocket, which can tell
// a client that its subscription was dropped.
func (c *streamConn) Websocket() bool { return c.kind == kindWebsocket }

// SubscriptionError makes the websocket subscription of ctx end with err
// (an "error" message) instead of "complete".
func (c *streamConn) SubscriptionError(ctx context.Context, err *gqlerror.Error) {
	if se, ok := ctx.Value(subscriptionErrorsKey{}).(*subscriptionErrors); ok {
		se.add(err)
	}
}

var _ resolvers.Stream = (*streamConn)(nil)

// admittedStream is the stream of an operation its websocket counted
// already: a resolver's admission of it counts nothing more.
type admittedStream struct{ *streamConn }

func (admittedStream) AdmitOperation() (release func(), ok bool) { return func() {}, true }

// streamTracker counts open stream connections per client address and per
// principal, in this process. Counts are local: with N instances behind a
// load balancer a client may hold up to N times the cap.
type streamTracker struct {
	limits StreamLimits
	m      *streamMetrics

	mu          sync.Mutex
	byIP        map[string]int
	byPrincipal map[string]int
}

func newStreamTracker(l StreamLimits, m *streamMetrics) *streamTracker {
	return &streamTracker{limits: l, m: m, byIP: map[string]int{}, byPrincipal: map[string]int{}}
}

func (t *streamTracker) acquire(counts map[string]int, key string, max int) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if counts[key] >= max {
		return false
	}
	counts[key]++
	return true
}

func (t *streamTracker) release(counts map[string]int, key string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if counts[key] <= 1 {
		delete(counts, key)
		return
	}
	counts[key]--
}

// streamKind tells a websocket upgrade or an SSE request (as gqlgen's
// transports recognise them) from an ordinary request.
func streamKind(r *http.Request) string {
	switch {
	case header.Get(r.Header, "Upgrade") != "":
		return kindWebsocket
	case r.Method == http.MethodPost && strings.Contains(header.Get(r.Header, "Accept"), "text/event-stream"):
		return kindSSE
	}
	return ""
}

// middleware admits stream connections under the per-address cap (and,
// for SSE whose principal is known from the header, the per-principal cap),
// and releases their slots when the connection ends: the transports
// return only then, except for an SSE stream taken from net/http, which
// keeps its slots (keep) until its client goes. An SSE stream also ends
// when its token expires.
func (t *streamTracker) middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		kind := streamKind(r)
		if kind == "" {
			next.ServeHTTP(w, r)
			return
		}
		ip := clientaddr.Key(r)
		if !t.acquire(t.byIP, ip, t.limits.ConnsPerIP) {
			t.m.refused.WithLabelValues("ip_limit").Inc()
			writeError(w, r, http.StatusTooManyRequests, "too many live connections from this address")
			return
		}
		c := &streamConn{kind: kind, tracker: t, ip: ip}
		defer c.handlerReturned()
		ctx := context.WithValue(r.Context(), streamConnKey{}, c)
		ctx = resolvers.WithStream(ctx, c)
		if kind == kindSSE {
			if p, ok := auth.PrincipalFrom(ctx); ok {
				if !c.bindPrincipal(p) {
					t.m.refused.WithLabelValues("principal_limit").Inc()
					writeError(w, r, http.StatusTooManyRequests, "too many live connections for this principal")
					return
				}
				ctx = c.expireAt(ctx, p.ExpiresAt)
			}
		}
		c.gauge = t.m.connections.WithLabelValues(kind)
		c.gauge.Inc()
		next.ServeHTTP(w, r.WithContext(ctx))
	})
}

// streamMetrics are the subscription transport's Prometheus series; the
// resolvers count active subscriptions and their messages, the hub
// deliveries, coalescing and its own latency (dropline_live_*).
type streamMetrics struct {
	connections *prometheus.GaugeVec
	refused     *prometheus.CounterVec
}

func newStreamMetrics(reg prometheus.Registerer) *streamMetrics {
	m := &streamMetrics{
		connections: prom.Register(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "dropline_graphql_stream_connections",
			Help: "Open subscription connections by transport (websocket, sse).",
		}, []string{"transport"})),
		refused: prom.Register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dropline_graphql_stream_refused_total",
			Help: "Subscription connections or operations refused, by reason (ip_limit, principal_limit, subscription_limit: the operations in flight on a connection, bad_token).",
		}, []string{"reason"})),
	}
	return m
}
