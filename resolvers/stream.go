package resolvers

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dropline/dropline/internal/prom"
)

// Stream is the connection a subscription arrives on, as the transport
// that carries it (websocket or SSE) describes it. The transport puts it in
// the request context with WithStream; a subscription outside any stream
// (a test calling the schema directly) is not capped.
type Stream interface {
	// AdmitSubscription counts one more subscription against the
	// connection's cap; release gives it back and may be called more than
	// once. ok is false when the connection is at its cap.
	AdmitSubscription() (release func(), ok bool)
	// Websocket reports whether the connection can carry an error message
	// for a subscription that ends without the client asking (SSE cannot:
	// its stream just completes).
	Websocket() bool
}

type streamKey struct{}

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
