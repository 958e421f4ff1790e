package requestid_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/internal/requestid"
)

// An id is one allocation on its context, which keeps the rest of a
// context: the values under it, a later id over it, its end.
func TestIDContext(t *testing.T) {
	type other struct{}
	require.Empty(t, requestid.From(context.Background()))
	parent, cancel := context.WithCancel(context.WithValue(context.Background(), other{}, "kept"))
	ctx := requestid.With(parent, "req-1")
	require.Equal(t, "req-1", requestid.From(ctx))
	require.Equal(t, "kept", ctx.Value(other{}))
	require.Equal(t, "req-2", requestid.From(requestid.With(ctx, "req-2")))
	child, stop := context.WithCancel(ctx)
	defer stop()
	cancel()
	<-child.Done()
	require.ErrorIs(t, ctx.Err(), context.Canceled)

	bg, id := context.Background(), strings.Repeat("f", 24) // made, as a request's is
	require.Equal(t, 1.0, testing.AllocsPerRun(100, func() { sink = requestid.With(bg, id) }))
}

// sink keeps what an allocation count makes on the heap, as a request does.
var sink context.Context
