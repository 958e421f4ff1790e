// Package tracing sets up OpenTelemetry traces for Dropline: an OTLP/HTTP
// exporter configured by the standard OTEL_* variables, the W3C trace
// context propagator, and the helpers the hot path uses to cost nothing
// while tracing is off.
//
// Tracing is on when OTEL_EXPORTER_OTLP_ENDPOINT or
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set (and neither OTEL_SDK_DISABLED
// nor OTEL_TRACES_EXPORTER=none says otherwise); the exporter then reads
// the rest of its settings (headers, timeout, compression, TLS) from the
// same variables, and the SDK its sampler (OTEL_TRACES_SAMPLER, default
// parentbased_always_on) and resource (OTEL_SERVICE_NAME,
// OTEL_RESOURCE_ATTRIBUTES). When it is off, New returns a Provider whose
// TracerProvider is nil: every instrumented part then skips its spans
// altogether (no no-op span, no context value, no allocation), which is how
// the reserve path stays as fast as it was without tracing.
//
// Nothing here is global: the provider is handed to each part that makes
// spans (the GraphQL handler, the inventory engine, the write-behind), and
// otel's global provider is left alone.
package tracing

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"
	"go.opentelemetry.io/otel/trace"
)

// The standard variables that decide whether traces are exported.
const (
	EnvEndpoint       = "OTEL_EXPORTER_OTLP_ENDPOINT"
	EnvTracesEndpoint = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
	EnvSDKDisabled    = "OTEL_SDK_DISABLED"
	EnvTracesExporter = "OTEL_TRACES_EXPORTER"
)

// Enabled reports whether the environment (read through getenv) asks for
// traces: an OTLP endpoint is set, the SDK is not disabled and the traces
// exporter is not "none".
func Enabled(getenv func(string) string) bool {
	if strings.EqualFold(strings.TrimSpace(getenv(EnvSDKDisabled)), "true") {
		return false
	}
	if e := strings.ToLower(strings.TrimSpace(getenv(EnvTracesExporter))); e != "" && e != "otlp" {
		return false
	}
	return strings.TrimSpace(getenv(EnvEndpoint)) != "" || strings.TrimSpace(getenv(EnvTracesEndpoint)) != ""
}

// Provider is the process' trace provider, or none. The zero value and nil
// are "tracing off".
type Provider struct {
	sdk *sdktrace.TracerProvider
}

// New starts the OTLP/HTTP exporter and the batching span processor when
// on is set, and returns an off Provider otherwise. version is recorded as
// service.version. Nothing is sent until the first span ends; an
// unreachable collector costs dropped spans (and a log line from the SDK),
// never a failed request.
func New(ctx context.Context, on bool, version string) (*Provider, error) {
	if !on {
		return &Provider{}, nil
	}
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, fmt.Errorf("starting the OTLP trace exporter: %w", err)
	}
	res, err := resource.New(ctx,
		resource.WithAttributes(semconv.ServiceName("dropline"), semconv.ServiceVersion(version)),
		// OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES win over the above.
		resource.WithFromEnv(),
		resource.WithHost(),
		resource.WithProcessPID(),
	)
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return nil, fmt.Errorf("describing the trace resource: %w", err)
	}
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp),
		sdktrace.WithResource(res),
	)
	return &Provider{sdk: tp}, nil
}

// TracerProvider returns the provider to make spans with, or nil when
// tracing is off. Callers keep the nil and skip their spans on it.
func (p *Provider) TracerProvider() trace.TracerProvider {
	if p == nil || p.sdk == nil {
		return nil
	}
	return p.sdk
}

// ForceFlush exports every span ended so far.
func (p *Provider) ForceFlush(ctx context.Context) error {
	if p == nil || p.sdk == nil {
		return nil
	}
	return p.sdk.ForceFlush(ctx)
}

// Shutdown exports what is left and stops the exporter, within ctx (at most
// five seconds: a collector that is gone must not hold up a shutdown).
func (p *Provider) Shutdown(ctx context.Context) error {
	if p == nil || p.sdk == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := p.sdk.Shutdown(ctx); err != nil {
		return fmt.Errorf("flushing traces: %w", err)
	}
	return nil
}

// Propagator is the one propagation format Dropline reads and writes: W3C
// trace context (traceparent, tracestate).
var Propagator propagation.TextMapPropagator = propagation.TraceContext{}

// Tracer returns the named tracer of tp, or nil when tp is nil.
func Tracer(tp trace.TracerProvider, name string) trace.Tracer {
	if tp == nil {
		return nil
	}
	return tp.Tracer(name)
}

// Traceparent is the W3C traceparent of ctx's span ("" when it has none, or
// it is not sampled: nothing downstream would record it).
func Traceparent(ctx context.Context) string {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() || !sc.IsSampled() {
		return ""
	}
	var b strings.Builder
	b.Grow(55)
	b.WriteString("00-")
	b.WriteString(sc.TraceID().String())
	b.WriteByte('-')
	b.WriteString(sc.SpanID().String())
	b.WriteString("-01")
	return b.String()
}

// ParseTraceparent is the span context a Traceparent string names, invalid
// when s is empty or malformed. The context is marked remote.
func ParseTraceparent(s string) trace.SpanContext {
	if s == "" {
		return trace.SpanContext{}
	}
	ctx := Propagator.Extract(context.Background(), propagation.MapCarrier{"traceparent": s})
	return trace.SpanContextFromContext(ctx)
}
