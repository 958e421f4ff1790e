package inventory

import (
	"context"
	"testing"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/dropline/dropline/internal/testenv"
	"github.com/dropline/dropline/internal/tracing"
)

// TestReserveCarriesItsTraceIntoTheOutbox: a traced reserve's run of
// reserve.lua is a span under the reserve's, linked to it, and the hold's
// outbox event carries the reserve's traceparent; an untraced reserve's
// event carries none.
func TestReserveCarriesItsTraceIntoTheOutbox(t *testing.T) {
	ctx := context.Background()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(ctx) })
	r := testenv.Redis(t)
	e, err := NewEngine(ctx, Config{KeyPrefix: r.Prefix, Tracer: tp}, r.Client, testenv.Postgres(t), zerolog.Nop())
	require.NoError(t, err)
	_, err = e.Catalog().CreateProduct(ctx, Principal{ID: "admin", Admin: true}, ProductInput{SKU: "TRACED", Name: "Traced", Price: Money{Amount: 1, Currency: "EUR"}, Stock: 10})
	require.NoError(t, err)

	octx, op := tp.Tracer("test").Start(ctx, "operation")
	res, err := e.Reserve(octx, Principal{ID: "alice"}, ReserveRequest{SKU: "TRACED", Quantity: 1})
	require.NoError(t, err)
	op.End()
	_, err = e.Reserve(ctx, Principal{ID: "bob"}, ReserveRequest{SKU: "TRACED", Quantity: 1})
	require.NoError(t, err)

	entries, err := e.Maintenance().Outbox("test", "c").Read(ctx, e.keys.PartitionOf("TRACED"), 100)
	require.NoError(t, err)
	carried := map[string]string{}
	for _, en := range entries {
		if en.Event.Kind == "reserve" {
			carried[en.Event.Principal] = en.Traceparent
		}
	}
	require.Equal(t, map[string]string{"alice": tracing.Traceparent(octx), "bob": ""}, carried)
	require.NotEmpty(t, res.Token)

	var script tracetest.SpanStub
	for _, s := range exp.GetSpans() {
		if s.Name == "script reserve" {
			script = s
		}
	}
	require.Equal(t, op.SpanContext().SpanID(), script.Parent.SpanID(), "the run is under the reserve that started it")
	require.Len(t, script.Links, 1)
	require.Equal(t, op.SpanContext().SpanID(), script.Links[0].SpanContext.SpanID(), "and links it")
	require.Equal(t, tracing.ParseTraceparent(carried["alice"]).SpanID(), op.SpanContext().SpanID())
}
