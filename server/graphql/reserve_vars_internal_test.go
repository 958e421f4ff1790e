package graphql

import (
	"context"
	"encoding/json"
	"testing"

	gqlgen "github.com/99designs/gqlgen/graphql"
	"github.com/stretchr/testify/require"
)

// A marked context is its parent with the mark: the mark is found through
// the contexts derived from it, the parent's values and cancellation pass
// through, and marking takes one allocation.
func TestMarkReserveVarsMarksTheContext(t *testing.T) {
	type other struct{}
	parent, cancel := context.WithCancel(context.WithValue(context.Background(), other{}, "kept"))
	vars := map[string]any{"input": map[string]any{"sku": "A", "quantity": json.Number("1")}}
	params := &gqlgen.RawParams{Variables: vars, OperationName: "Reserve"}

	ctx := markReserveVars(parent, params)
	derived, stop := context.WithCancel(context.WithValue(ctx, struct{ k int }{1}, 2))
	defer stop()
	for _, c := range []context.Context{ctx, derived} {
		m, _ := c.Value(reserveVarsKey{}).(*reserveVarsMark)
		require.NotNil(t, m)
		require.Equal(t, "Reserve", m.opName)
		require.Equal(t, vars, m.vars)
		require.Equal(t, "kept", c.Value(other{}))
	}
	cancel()
	<-derived.Done()
	require.ErrorIs(t, derived.Err(), context.Canceled)

	require.Nil(t, markReserveVars(parent, &gqlgen.RawParams{Variables: map[string]any{"input": 1}}).Value(reserveVarsKey{}),
		"other variables are not marked")
	require.LessOrEqual(t, testing.AllocsPerRun(100, func() { _ = markReserveVars(parent, params) }), 1.0)
}

// The shapes marked are a sku string and an integer quantity, with a key
// string and an integer hold length when given; anything else is left to
// gqlparser's coercion.
func TestPlainReserveVarsShapes(t *testing.T) {
	n := func(s string) json.Number { return json.Number(s) }
	for _, c := range []struct {
		in    map[string]any
		plain bool
	}{
		{map[string]any{"sku": "A", "quantity": n("1")}, true},
		{map[string]any{"sku": "A", "quantity": n("1"), "idempotencyKey": "k"}, true},
		{map[string]any{"sku": "A", "quantity": n("1"), "holdSeconds": n("60")}, true},
		{map[string]any{"sku": "A", "quantity": n("1"), "idempotencyKey": "", "holdSeconds": n("60")}, true},
		{map[string]any{"sku": "A", "quantity": n("1"), "idempotencyKey": nil}, false},
		{map[string]any{"sku": "A", "quantity": n("1"), "idempotencyKey": n("7")}, false},
		{map[string]any{"sku": "A", "quantity": n("1"), "holdSeconds": n("1.5")}, false},
		{map[string]any{"sku": "A", "quantity": n("1"), "holdSeconds": "60"}, false},
		{map[string]any{"sku": "A", "quantity": n("1"), "admissionPass": "p"}, false},
		{map[string]any{"sku": "A", "quantity": n("1"), "idempotencyKey": "k", "holdSeconds": n("60"), "admissionPass": "p"}, false},
		{map[string]any{"sku": "A", "idempotencyKey": "k"}, false},
		{map[string]any{"quantity": n("1"), "idempotencyKey": "k"}, false},
	} {
		require.Equal(t, c.plain, plainReserveVars(map[string]any{"input": c.in}), "%v", c.in)
	}
}
