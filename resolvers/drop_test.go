package resolvers_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/internal/graphqltest"
	"github.com/dropline/dropline/internal/testenv"
)

const (
	dropFields = `id dropId name maxPerUser saleStartsAt saleEndsAt products { sku drop { dropId } }`
	dropDoc    = `mutation($i: CreateDropInput!) { createDrop(input: $i) { drop { ` + dropFields + ` } ` + userErrorFields + ` } }`
)

type dropPayload struct {
	Drop *struct {
		ID, DropID, Name string
		MaxPerUser       int
		Products         []struct {
			Sku  string
			Drop *struct{ DropID string }
		}
	}
	UserErrors []struct {
		Code    string
		Field   []string
		Message string
	}
}

func TestDropsOverGraphQL(t *testing.T) {
	t.Parallel()
	for _, backend := range testenv.Backends {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			dropsOverGraphQL(t, graphqltest.SetupOn(t, backend))
		})
	}
}

func dropsOverGraphQL(t *testing.T, e *graphqltest.Env) {
	admin, alice := e.Token(t, "admin", true), e.Token(t, "alice", false)

	var denied struct{ CreateDrop dropPayload }
	e.MustDo(t, alice, dropDoc, map[string]any{"i": map[string]any{"id": "SB", "name": "Dunk", "maxPerUser": 1}}, &denied)
	require.Equal(t, "FORBIDDEN", denied.CreateDrop.UserErrors[0].Code)
	var bad struct{ CreateDrop dropPayload }
	e.MustDo(t, admin, dropDoc, map[string]any{"i": map[string]any{"id": "SB", "name": "Dunk", "maxPerUser": 0}}, &bad)
	require.Equal(t, "INVALID_INPUT", bad.CreateDrop.UserErrors[0].Code)
	require.Equal(t, []string{"input", "maxPerUser"}, bad.CreateDrop.UserErrors[0].Field)

	var made struct{ CreateDrop dropPayload }
	e.MustDo(t, admin, dropDoc, map[string]any{"i": map[string]any{"id": "SB", "name": "Dunk Low", "maxPerUser": 1}}, &made)
	require.Empty(t, made.CreateDrop.UserErrors)
	require.Equal(t, b64("Drop:SB"), made.CreateDrop.Drop.ID)
	require.Empty(t, made.CreateDrop.Drop.Products)
	for _, size := range []string{"SB-42", "SB-43"} {
		e.CreateProduct(t, map[string]any{"sku": size, "stock": 5, "drop": "SB"})
	}
	var missing struct{ CreateProduct payload }
	e.MustDo(t, admin, createDoc, map[string]any{"i": map[string]any{"sku": "SB-44", "name": "x", "stock": 1,
		"price": map[string]any{"amount": 1, "currency": "EUR"}, "drop": "NOPE"}}, &missing)
	ue := only(t, missing.CreateProduct, "NOT_FOUND")
	require.Equal(t, []string{"input", "drop"}, ue.Field)

	var q struct {
		D *struct {
			DropID   string
			Products []struct{ Sku string }
		} `json:"drop"`
		Product struct {
			Drop *struct{ DropID, Name string }
		}
		None *struct{ DropID string }
		Node *struct{ DropID string }
	}
	e.MustDo(t, "", `{ drop(id: "SB") { dropId products { sku } } product(sku: "SB-43") { drop { dropId name } }
		None: drop(id: "nope") { dropId } Node: node(id: "`+b64("Drop:SB")+`") { ... on Drop { dropId } } }`, nil, &q)
	require.Equal(t, "SB", q.D.DropID)
	require.Len(t, q.D.Products, 2)
	require.Equal(t, "SB-42", q.D.Products[0].Sku)
	require.Equal(t, "Dunk Low", q.Product.Drop.Name)
	require.Nil(t, q.None)
	require.Equal(t, "SB", q.Node.DropID)

	require.Empty(t, e.Reserve(t, alice, map[string]any{"sku": "SB-42", "quantity": 1}).UserErrors)
	ue = only(t, e.Reserve(t, alice, map[string]any{"sku": "SB-43", "quantity": 1}), "QUOTA_EXCEEDED")
	require.Equal(t, "per-customer limit is 1 and 1 are already held or bought", ue.Message)
}
