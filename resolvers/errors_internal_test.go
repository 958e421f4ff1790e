package resolvers

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
	"github.com/vektah/gqlparser/v2/ast"
	"github.com/vektah/gqlparser/v2/gqlerror"

	"github.com/dropline/dropline/graph/model"
	"github.com/dropline/dropline/internal/requestid"
	"github.com/dropline/dropline/inventory"
	outcomes "github.com/dropline/dropline/inventory/outcome"
)

func TestPresenterHidesInternalErrors(t *testing.T) {
	t.Parallel()
	var logs bytes.Buffer
	present := presenter()
	ctx := requestid.With(context.Background(), "rid-42")
	ctx = zerolog.New(&logs).With().Str("request_id", "rid-42").Logger().WithContext(ctx)
	path := ast.Path{ast.PathName("product")}

	got := present(ctx, gqlerror.WrapPath(path, internal(errors.New("pq: password authentication failed for dropline"))))
	require.Equal(t, "internal error", got.Message)
	require.Equal(t, map[string]any{"code": CodeInternal, "requestId": "rid-42"}, got.Extensions)
	require.Equal(t, path, got.Path)
	require.Contains(t, logs.String(), "password authentication failed", "the operator sees the detail")
	require.Contains(t, logs.String(), "rid-42")

	// An unclassified error is internal too: unknown means unsafe to show.
	got = present(ctx, gqlerror.WrapPath(path, errors.New("surprise")))
	require.Equal(t, CodeInternal, got.Extensions["code"])

	// Business outcomes keep their code and a public message only.
	wrapped := fmt.Errorf("reading product: %w: %w", inventory.ErrUnavailable, errors.New("dial tcp 10.0.0.7:5432"))
	got = present(ctx, gqlerror.WrapPath(path, wrapped))
	require.Equal(t, "UNAVAILABLE", got.Extensions["code"])
	require.NotContains(t, got.Message, "10.0.0.7")

	// Errors gqlgen built itself (validation, limits) pass through.
	v := gqlerror.Errorf("Cannot query field")
	require.Same(t, v, present(ctx, v))
}

func TestRecoverTurnsPanicsIntoInternalErrors(t *testing.T) {
	t.Parallel()
	var logs bytes.Buffer
	ctx := requestid.With(context.Background(), "rid-7")
	ctx = zerolog.New(&logs).WithContext(ctx)
	err := recoverer()(ctx, "nil map write")
	got := presenter()(ctx, gqlerror.WrapPath(ast.Path{ast.PathName("reserve")}, err))
	require.Equal(t, "internal error", got.Message)
	require.Equal(t, "rid-7", got.Extensions["requestId"])
	require.Equal(t, 1, strings.Count(logs.String(), "\n"), "logged once, with its stack")
	require.Contains(t, logs.String(), "nil map write")
	require.Contains(t, logs.String(), "stack")
}

// TestEveryOutcomeIsAnErrorCode ties the engine's outcomes to the schema's
// ErrorCode enum: each outcome's code is a value of the enum, and each value
// of the enum is an outcome's code or one of the few refusals this layer
// decides itself. A userError's code is the outcome's, converted, never
// looked up in a second table.
func TestEveryOutcomeIsAnErrorCode(t *testing.T) {
	t.Parallel()
	codes := map[model.ErrorCode]bool{}
	for _, o := range outcomes.All() {
		c := model.ErrorCode(o.Code())
		require.True(t, c.IsValid(), "the schema's ErrorCode has no %s", c)
		codes[c] = true
	}
	own := map[model.ErrorCode]bool{CodeUnauthenticated: true}
	for _, c := range model.AllErrorCode {
		require.True(t, codes[c] != own[c], "%s must be exactly one of an engine outcome and a code of this layer", c)
	}
}
