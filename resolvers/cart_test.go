package resolvers_test

import (
	"testing"

	"github.com/stretchr/testify/require"
)

const (
	cartFields = `cart { id token status expiresAt lines { ` + reservationFields + ` } }
		userErrors { code field message available }`
	reserveCartDoc = `mutation($i: ReserveCartInput!) { reserveCart(input: $i) { ` + cartFields + ` } }`
	commitCartDoc  = `mutation($i: CommitCartInput!) { commitCart(input: $i) { ` + cartFields + ` } }`
	cancelCartDoc  = `mutation($i: CancelCartInput!) { cancelCart(input: $i) { ` + cartFields + ` } }`
	extendCartDoc  = `mutation($i: ExtendCartInput!) { extendCart(input: $i) { ` + cartFields + ` } }`
)

type cartUserError struct {
	Code      string   `json:"code"`
	Field     []string `json:"field"`
	Message   string   `json:"message"`
	Available *int     `json:"available"`
}

type cartPayload struct {
	Cart *struct {
		ID     string        `json:"id"`
		Token  string        `json:"token"`
		Status string        `json:"status"`
		Lines  []reservation `json:"lines"`
	} `json:"cart"`
	UserErrors []cartUserError `json:"userErrors"`
}

func TestCartCheckoutOverGraphQL(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.CreateProduct(t, map[string]any{"sku": "TEE-S", "stock": 3})
	e.CreateProduct(t, map[string]any{"sku": "CAP", "stock": 1})
	e.CreateProduct(t, map[string]any{"sku": "MUG", "stock": 5, "maxPerUser": 1})
	alice, bob := e.Token(t, "alice", false), e.Token(t, "bob", false)

	do := func(authz, doc string, in map[string]any) cartPayload {
		t.Helper()
		var out map[string]cartPayload
		e.MustDo(t, authz, doc, map[string]any{"i": in}, &out)
		require.Len(t, out, 1)
		for _, p := range out {
			return p
		}
		return cartPayload{}
	}
	line := func(sku string, q int) map[string]any { return map[string]any{"sku": sku, "quantity": q} }

	// Two short lines: each named, with what it could have had; nothing held.
	refused := do(alice, reserveCartDoc, map[string]any{"lines": []any{line("TEE-S", 2), line("CAP", 2), line("MUG", 2)}})
	require.Nil(t, refused.Cart)
	require.Len(t, refused.UserErrors, 2)
	require.Equal(t, "OUT_OF_STOCK", refused.UserErrors[0].Code)
	require.Equal(t, []string{"input", "lines", "1", "quantity"}, refused.UserErrors[0].Field)
	require.Equal(t, 1, *refused.UserErrors[0].Available)
	require.Equal(t, "QUOTA_EXCEEDED", refused.UserErrors[1].Code)
	require.Equal(t, []string{"input", "lines", "2", "quantity"}, refused.UserErrors[1].Field)
	require.Equal(t, 1, *refused.UserErrors[1].Available)
	var q struct{ Product product }
	e.MustDo(t, "", `{ product(sku: "TEE-S") { `+productFields+` } }`, nil, &q)
	require.Equal(t, 3, q.Product.Stock.Available, "a refused cart holds nothing")

	// Lines of one SKU are added up: 2 + 2 of a SKU with 3.
	summed := do(alice, reserveCartDoc, map[string]any{"lines": []any{line("TEE-S", 2), line("TEE-S", 2)}})
	require.Len(t, summed.UserErrors, 2)
	require.Equal(t, []string{"input", "lines", "0", "quantity"}, summed.UserErrors[0].Field)
	require.Equal(t, 3, *summed.UserErrors[1].Available)

	held := do(alice, reserveCartDoc, map[string]any{"lines": []any{line("TEE-S", 2), line("CAP", 1), line("TEE-S", 1)}, "idempotencyKey": "checkout-1"})
	require.Empty(t, held.UserErrors)
	require.Equal(t, "HELD", held.Cart.Status)
	require.Len(t, held.Cart.Lines, 2)
	require.Equal(t, 3, held.Cart.Lines[0].Quantity)
	replay := do(alice, reserveCartDoc, map[string]any{"lines": []any{line("TEE-S", 2), line("CAP", 1), line("TEE-S", 1)}, "idempotencyKey": "checkout-1"})
	require.Equal(t, held.Cart.Token, replay.Cart.Token)

	// A line is a reservation: readable, but sold only with its cart.
	var r struct{ Reservation *reservation }
	e.MustDo(t, alice, `query($t: ID!) { reservation(token: $t) { `+reservationFields+` } }`, map[string]any{"t": held.Cart.Lines[1].Token}, &r)
	require.Equal(t, "HELD", r.Reservation.Status)
	var c struct{ Commit payload }
	e.MustDo(t, alice, commitDoc, map[string]any{"i": map[string]any{"token": held.Cart.Lines[1].Token}}, &c)
	only(t, c.Commit, "INVALID_INPUT")
	var node struct {
		Node *struct{ Token string } `json:"node"`
	}
	e.MustDo(t, alice, `query($id: ID!) { node(id: $id) { ... on Cart { token } } }`, map[string]any{"id": held.Cart.ID}, &node)
	require.Equal(t, held.Cart.Token, node.Node.Token)

	require.Equal(t, "FORBIDDEN", do(bob, commitCartDoc, map[string]any{"token": held.Cart.Token}).UserErrors[0].Code)
	longer := do(alice, extendCartDoc, map[string]any{"token": held.Cart.Token, "holdSeconds": 1800})
	require.Empty(t, longer.UserErrors)
	require.Equal(t, "HELD", longer.Cart.Status)
	for _, l := range longer.Cart.Lines {
		require.True(t, l.ExpiresAt.After(held.Cart.Lines[0].ExpiresAt), "every line has the cart's new expiry")
	}
	require.Equal(t, "INVALID_INPUT", do(alice, extendCartDoc, map[string]any{"token": held.Cart.Token, "holdSeconds": 0}).UserErrors[0].Code)
	sold := do(alice, commitCartDoc, map[string]any{"token": held.Cart.Token})
	require.Empty(t, sold.UserErrors)
	require.Equal(t, "COMMITTED", sold.Cart.Status)
	for _, l := range sold.Cart.Lines {
		require.Equal(t, "COMMITTED", l.Status)
		require.NotNil(t, l.CommittedAt)
	}
	require.Equal(t, "ALREADY_COMMITTED", do(alice, cancelCartDoc, map[string]any{"token": held.Cart.Token}).UserErrors[0].Code)
	var mine struct {
		MyReservations struct {
			Edges []struct{ Node reservation }
		}
	}
	e.MustDo(t, alice, `{ myReservations(status: COMMITTED) { edges { node { `+reservationFields+` } } } }`, nil, &mine)
	var listed []string
	for _, ed := range mine.MyReservations.Edges {
		listed = append(listed, ed.Node.Token)
	}
	require.ElementsMatch(t, []string{held.Cart.Lines[0].Token, held.Cart.Lines[1].Token}, listed, "myReservations shows the cart's lines")

	mug := do(bob, reserveCartDoc, map[string]any{"lines": []any{line("MUG", 1)}})
	require.Empty(t, mug.UserErrors)
	gone := do(bob, cancelCartDoc, map[string]any{"token": mug.Cart.Token})
	require.Empty(t, gone.UserErrors)
	require.Equal(t, "CANCELLED", gone.Cart.Status)
	require.Equal(t, "ALREADY_CANCELLED", do(bob, commitCartDoc, map[string]any{"token": mug.Cart.Token}).UserErrors[0].Code)
}
