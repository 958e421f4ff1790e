package graphql_test

import (
	"fmt"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/resolvers"
	"github.com/dropline/dropline/server/graphql"
)

const entitiesDoc = `query($r: [_Any!]!) { _entities(representations: $r) {
	... on Product { sku name stock { available } }
	... on Reservation { token status }
	... on Drop { dropId name } } }`

// A server that is no subgraph refuses _service and _entities; one that is
// prints its SDL with the keys and resolves each entity as the matching
// Query field does: a reservation only for its holder, at most
// MaxEntities representations, each priced as its selection.
func TestSubgraph(t *testing.T) {
	t.Parallel()
	off := setup(t)
	errs := off.Do(t, "", `{ _service { sdl } }`, nil, nil)
	require.Len(t, errs, 1)
	require.Equal(t, graphql.CodeSubgraphDisabled, errs[0].Code())
	errs = off.Do(t, "", entitiesDoc, map[string]any{"r": []any{map[string]any{"__typename": "Product", "sku": "X"}}}, nil)
	require.Len(t, errs, 1)
	require.Equal(t, graphql.CodeSubgraphDisabled, errs[0].Code())

	e := setup(t, func(c *graphql.Config) { c.Subgraph = true })
	var svc struct {
		Service struct{ Sdl string } `json:"_service"`
	}
	e.MustDo(t, "", `{ _service { sdl } }`, nil, &svc)
	for _, key := range []string{`type Product implements Node @key(fields: "sku")`, `type Reservation implements Node @key(fields: "token")`, `type Drop implements Node @key(fields: "dropId")`, `specs.apollo.dev/federation/v2`} {
		require.Contains(t, svc.Service.Sdl, key)
	}

	e.CreateProduct(t, map[string]any{"sku": "FED-1", "stock": 3})
	alice, bob := e.Token(t, "alice", false), e.Token(t, "bob", false)
	hold := e.Reserve(t, alice, map[string]any{"sku": "FED-1", "quantity": 1, "idempotencyKey": "f-1"}).Reservation.Token
	reps := []any{
		map[string]any{"__typename": "Product", "sku": "FED-1"},
		map[string]any{"__typename": "Product", "sku": "NONE"},
		map[string]any{"__typename": "Reservation", "token": hold},
	}
	type entity struct {
		SKU    string `json:"sku"`
		Status string `json:"status"`
		Stock  *struct {
			Available int `json:"available"`
		} `json:"stock"`
	}
	var got struct {
		Entities []*entity `json:"_entities"`
	}
	require.Empty(t, e.Do(t, alice, entitiesDoc, map[string]any{"r": reps}, &got))
	require.Len(t, got.Entities, 3)
	require.Equal(t, 2, got.Entities[0].Stock.Available)
	require.Nil(t, got.Entities[1], "an unknown SKU is null")
	require.Equal(t, "HELD", got.Entities[2].Status, "alice's own hold")
	got.Entities = nil
	e.Do(t, bob, entitiesDoc, map[string]any{"r": reps}, &got)
	require.Len(t, got.Entities, 3)
	require.Nil(t, got.Entities[2], "bob reads nothing of alice's hold")
	got.Entities = nil
	errs = e.Do(t, "", entitiesDoc, map[string]any{"r": reps}, &got)
	require.NotEmpty(t, errs, "an anonymous caller is told to sign in")
	require.True(t, len(got.Entities) < 3 || got.Entities[2] == nil)

	// Priced per representation, and bounded.
	srv := httptest.NewServer(e.Handler)
	t.Cleanup(srv.Close)
	cost := func(n int) (int, string) {
		t.Helper()
		r := make([]any, n)
		for i := range r {
			r[i] = map[string]any{"__typename": "Product", "sku": fmt.Sprintf("FED-%d", i)}
		}
		res := post(t, srv, "", body(t, `query($r: [_Any!]!) { _entities(representations: $r) { ... on Product { sku name } } }`, map[string]any{"r": r}), map[string]string{})
		if len(res.Errors) > 0 {
			return 0, res.Errors[0].Code()
		}
		requested, _ := res.Extensions["cost"].(map[string]any)["requestedQueryCost"].(float64)
		return int(requested), ""
	}
	one, _ := cost(1)
	hundred, _ := cost(resolvers.MaxEntities)
	require.Equal(t, 1+2, one)
	require.Equal(t, 1+2*resolvers.MaxEntities, hundred)
	_, code := cost(resolvers.MaxEntities + 1)
	require.Equal(t, graphql.CodeTooManyRepresentations, code)
}
