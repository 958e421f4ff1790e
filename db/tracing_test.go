package db_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/dropline/dropline/db"
	"github.com/dropline/dropline/internal/testenv"
)

// TestOneSpanPerTransaction: a traced ledger gives each transaction run
// inside a traced operation one span under the operation's, named for the
// transaction, marked as an error when it rolled back; a transaction
// outside any operation, or on an untraced ledger, makes none, and
// Traced(nil) is the ledger itself.
func TestOneSpanPerTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(ctx) })
	pool := testenv.Postgres(t)
	plain := db.NewLedger(pool)
	require.Same(t, plain, plain.Traced(nil))
	l := plain.Traced(tp)

	octx, op := tp.Tracer("test").Start(ctx, "operation")
	_, err := l.CreateProduct(octx, db.Product{SKU: "TX-1", Name: "n", PriceAmount: 1, PriceCurrency: "EUR", Total: 5})
	require.NoError(t, err)
	_, err = l.CreateProduct(octx, db.Product{SKU: "TX-1", Name: "n", PriceAmount: 1, PriceCurrency: "EUR", Total: 5})
	require.ErrorIs(t, err, db.ErrExists)
	_, err = l.Restock(octx, "TX-1", 3, "restock-1")
	require.NoError(t, err)
	op.End()
	_, err = l.CreateProduct(ctx, db.Product{SKU: "TX-2", Name: "n", PriceAmount: 1, PriceCurrency: "EUR", Total: 5})
	require.NoError(t, err)
	_, err = plain.CreateProduct(octx, db.Product{SKU: "TX-3", Name: "n", PriceAmount: 1, PriceCurrency: "EUR", Total: 5})
	require.NoError(t, err)

	var got []string
	for _, s := range exp.GetSpans() {
		if s.Name == "operation" {
			continue
		}
		require.Equal(t, op.SpanContext().SpanID(), s.Parent.SpanID(), "%s is under the operation", s.Name)
		status := s.Name
		if s.Status.Code == codes.Error {
			status += " (rolled back)"
		}
		got = append(got, status)
	}
	require.Equal(t, []string{"transaction create_product", "transaction create_product (rolled back)", "transaction restock"}, got)
}
