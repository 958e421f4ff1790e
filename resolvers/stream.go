package resolvers

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vektah/gqlparser/v2/gqlerror"

	"github.com/dropline/dropline/internal/prom"
)

// Stream is the connection a subscription arrives on, as the transport
// that carries it (websocket or SSE) describes it. The transport puts it in
// the request context with WithStream; a subscription outside any stream
// (a test calling the schema directly) is not capped.
type Stream interface {
	// AdmitOperation counts one more operation in flight against the
	// connection's cap (a websocket counts every operation it carries,
	// and its resolvers' admissions then count nothing more; SSE carries
	// one subscription per connection); release gives it back and may be
	// called more than once. ok is false when the connection is at its
	// cap: the operation is refused with ErrTooManyOperations.
	AdmitOperation() (release func(), ok bool)
	// Websocket reports whether the connection can carry an error message
	// for a subscription that ends without the client asking (SSE cannot:
	// its stream just completes).
	Websocket() bool
	// SubscriptionError makes the subscription of ctx end with err, an
	// error message, instead of a "complete" the client would take for a
	// normal end. Only a websocket has such a message.
	SubscriptionError(ctx context.Context, err *gqlerror.Error)
}

// StockObserver watches a stockChanged subscription that is executed once
// for many identical ones (the transport's shared subscriptions): it learns
// which SKU each value belongs to, in the order the values reach
// execution, and when the live feed ended without anyone asking. Such a
// subscription is not counted in the active gauge: its members are
// (SubscriptionStarted).
type StockObserver interface {
	// StockObserved is called with a value's SKU just before the value is
	// handed to execution; every call is followed by exactly one response.
	StockObserved(sku string)
	// StockDropped is called when the feed ended while the subscription's
	// context was still live (a stall, or the hub stopping).
	StockDropped()
}

type streamKey struct{}

type observerKey struct{}

// WithStockObserver returns ctx whose stockChanged subscription reports to o.
func WithStockObserver(ctx context.Context, o StockObserver) context.Context {
	return context.WithValue(ctx, observerKey{}, o)
}

func stockObserverFrom(ctx context.Context) StockObserver {
	o, _ := ctx.Value(observerKey{}).(StockObserver)
	return o
}

// WithStream returns ctx carrying the stream a subscription arrives on.
func WithStream(ctx context.Context, s Stream) context.Context {
	return context.WithValue(ctx, streamKey{}, s)
}

// StreamFrom returns the stream ctx's subscription arrives on, or nil.
func StreamFrom(ctx context.Context) Stream {
	s, _ := ctx.Value(streamKey{}).(Stream)
	return s
}

// subscriptionMetrics are the subscriptions' Prometheus series; the
// transport counts connections and refusals, the hub deliveries,
// coalescing and its own latency (dropline_live_*).
type subscriptionMetrics struct {
	active *prometheus.GaugeVec
	sent   *prometheus.CounterVec
	ended  *prometheus.CounterVec
}

func newSubscriptionMetrics(reg prometheus.Registerer) *subscriptionMetrics {
	m := &subscriptionMetrics{
		active: prom.Register(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "dropline_graphql_subscriptions_active",
			Help: "Active GraphQL subscriptions by field.",
		}, []string{"field"})),
		sent: prom.Register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dropline_graphql_subscription_messages_total",
			Help: "Subscription payloads handed to the transport, by field.",
		}, []string{"field"})),
		ended: prom.Register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dropline_graphql_subscriptions_ended_total",
			Help: "Subscriptions ended, by field and reason (client, complete, dropped).",
		}, []string{"field", "reason"})),
	}
	return m
}
