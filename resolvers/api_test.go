package resolvers_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/99designs/gqlgen/client"
	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/server/graphql"
)

func TestCatalogueQueries(t *testing.T) {
	t.Parallel()
	e := setup(t)
	for _, sku := range []string{"A-1", "B-2", "C-3", "D-4", "E-5"} {
		e.CreateProduct(t, map[string]any{"sku": sku, "stock": 10, "maxPerUser": 2})
	}

	t.Run("product", func(t *testing.T) {
		var out struct{ Product *product }
		e.MustDo(t, "", `query($s: ID!) { product(sku: $s) { `+productFields+` } }`, map[string]any{"s": "B-2"}, &out)
		require.NotNil(t, out.Product)
		require.Equal(t, b64("Product:B-2"), out.Product.ID)
		require.Equal(t, 1999, out.Product.Price.Amount)
		require.Equal(t, "EUR", out.Product.Price.Currency)
		require.Equal(t, 2, *out.Product.MaxPerUser)
		require.Equal(t, stock{ID: b64("Stock:B-2"), Sku: "B-2", Available: 10, Total: 10, UpdatedAt: out.Product.Stock.UpdatedAt}, out.Product.Stock)
	})

	t.Run("unknown product is null", func(t *testing.T) {
		var out struct{ Product *product }
		e.MustDo(t, "", `{ product(sku: "NOPE") { sku } }`, nil, &out)
		require.Nil(t, out.Product)
	})

	t.Run("node", func(t *testing.T) {
		var out struct {
			P *struct{ Sku string }    `json:"p"`
			S *struct{ Available int } `json:"s"`
			X *struct{ Sku string }    `json:"x"`
		}
		e.MustDo(t, "", `query($p: ID!, $s: ID!, $x: ID!) {
			p: node(id: $p) { ... on Product { sku } }
			s: node(id: $s) { ... on Stock { available } }
			x: node(id: $x) { ... on Product { sku } } }`,
			map[string]any{"p": b64("Product:C-3"), "s": b64("Stock:C-3"), "x": "not-an-id"}, &out)
		require.Equal(t, "C-3", out.P.Sku)
		require.Equal(t, 10, out.S.Available)
		require.Nil(t, out.X)
	})

	t.Run("pagination", func(t *testing.T) {
		type page struct {
			Products struct {
				Edges []struct {
					Cursor string
					Node   struct{ Sku string }
				}
				PageInfo struct {
					HasNextPage, HasPreviousPage bool
					StartCursor, EndCursor       *string
				}
			}
		}
		doc := `query($n: Int, $a: String) { products(first: $n, after: $a) { edges { cursor node { sku } }
			pageInfo { hasNextPage hasPreviousPage startCursor endCursor } } }`
		var seen []string
		var after any
		for i := 0; ; i++ {
			var p page
			e.MustDo(t, "", doc, map[string]any{"n": 2, "a": after}, &p)
			for _, edge := range p.Products.Edges {
				seen = append(seen, edge.Node.Sku)
			}
			require.Equal(t, i > 0, p.Products.PageInfo.HasPreviousPage)
			if !p.Products.PageInfo.HasNextPage {
				break
			}
			require.Equal(t, p.Products.Edges[len(p.Products.Edges)-1].Cursor, *p.Products.PageInfo.EndCursor)
			after = *p.Products.PageInfo.EndCursor
		}
		require.Equal(t, []string{"A-1", "B-2", "C-3", "D-4", "E-5"}, seen)
	})

	t.Run("first is bounded", func(t *testing.T) {
		for _, n := range []int{0, 101} {
			errs := e.Do(t, "", `query($n: Int) { products(first: $n) { edges { cursor } } }`, map[string]any{"n": n}, nil)
			require.Len(t, errs, 1)
			require.Equal(t, "INVALID_INPUT", errs[0].Code())
		}
		errs := e.Do(t, "", `{ products(after: "garbage") { edges { cursor } } }`, nil, nil)
		require.Len(t, errs, 1)
		require.Equal(t, "INVALID_INPUT", errs[0].Code())
	})
}

// A page of products reads all their stock in one Redis round trip.
func TestProductStockIsOneRoundTrip(t *testing.T) {
	t.Parallel()
	e := setup(t)
	for i := range 8 {
		e.CreateProduct(t, map[string]any{"sku": fmt.Sprintf("S-%d", i), "stock": i})
	}
	// Warm: the first read after create may rebuild a SKU from Postgres.
	e.MustDo(t, "", `{ products(first: 8) { edges { node { stock { available } } } } }`, nil, nil)
	e.StockReads.Store(0)
	var out struct {
		Products struct {
			Edges []struct{ Node product }
		}
	}
	e.MustDo(t, "", `{ products(first: 8) { edges { node { `+productFields+` } } } }`, nil, &out)
	require.Len(t, out.Products.Edges, 8)
	for i, edge := range out.Products.Edges {
		require.Equal(t, i, edge.Node.Stock.Total)
	}
	require.Equal(t, int64(1), e.StockReads.Load(), "stock of a page must be one pipelined round trip")
}

func TestReserveCommitCancel(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.CreateProduct(t, map[string]any{"sku": "DROP", "stock": 5})
	alice := e.Token(t, "alice", false)

	held := e.Reserve(t, alice, map[string]any{"sku": "DROP", "quantity": 2, "holdSeconds": 60})
	require.Empty(t, held.UserErrors)
	r := held.Reservation
	require.Equal(t, "HELD", r.Status)
	require.Equal(t, b64("Reservation:"+r.Token), r.ID)
	require.Equal(t, 3, r.Product.Stock.Available)
	require.Equal(t, 2, r.Product.Stock.Held)
	require.WithinDuration(t, time.Now().Add(60*time.Second), r.ExpiresAt, 5*time.Second)

	var q struct{ Reservation *reservation }
	e.MustDo(t, alice, `query($t: ID!) { reservation(token: $t) { `+reservationFields+` } }`, map[string]any{"t": r.Token}, &q)
	require.Equal(t, r.Token, q.Reservation.Token)

	var n struct{ Node *struct{ Token string } }
	e.MustDo(t, alice, `query($id: ID!) { node(id: $id) { ... on Reservation { token } } }`, map[string]any{"id": r.ID}, &n)
	require.Equal(t, r.Token, n.Node.Token)

	done := e.Commit(t, alice, r.Token)
	require.Empty(t, done.UserErrors)
	require.Equal(t, "COMMITTED", done.Reservation.Status)
	require.NotNil(t, done.Reservation.CommittedAt)
	require.Equal(t, 2, done.Reservation.Product.Stock.Sold)

	again := e.Commit(t, alice, r.Token) // idempotent replay
	require.Empty(t, again.UserErrors)
	require.Equal(t, "COMMITTED", again.Reservation.Status)

	only(t, e.Cancel(t, alice, r.Token), "ALREADY_COMMITTED")

	second := e.Reserve(t, alice, map[string]any{"sku": "DROP", "quantity": 1})
	require.Empty(t, second.UserErrors)
	require.WithinDuration(t, time.Now().Add(600*time.Second), second.Reservation.ExpiresAt, 5*time.Second, "default hold is 600 s")
	cancelled := e.Cancel(t, alice, second.Reservation.Token)
	require.Empty(t, cancelled.UserErrors)
	require.Equal(t, "CANCELLED", cancelled.Reservation.Status)
	require.Equal(t, 3, cancelled.Reservation.Product.Stock.Available, "5 - 2 sold; the cancelled unit is back")
	require.Equal(t, 0, cancelled.Reservation.Product.Stock.Held)
	only(t, e.Commit(t, alice, second.Reservation.Token), "ALREADY_CANCELLED")
	require.Empty(t, e.Cancel(t, alice, second.Reservation.Token).UserErrors, "cancelling twice replays")
}

func TestBusinessOutcomesAreUserErrors(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.CreateProduct(t, map[string]any{"sku": "TINY", "stock": 2, "maxPerUser": 3})
	e.CreateProduct(t, map[string]any{"sku": "LIMIT", "stock": 50, "maxPerUser": 1})
	e.CreateProduct(t, map[string]any{"sku": "OWN", "stock": 5})
	e.CreateProduct(t, map[string]any{"sku": "LATER", "stock": 5, "saleStartsAt": time.Now().Add(time.Hour).Format(time.RFC3339)})
	alice, bob := e.Token(t, "alice", false), e.Token(t, "bob", false)

	t.Run("OUT_OF_STOCK", func(t *testing.T) {
		ue := only(t, e.Reserve(t, alice, map[string]any{"sku": "TINY", "quantity": 3}), "OUT_OF_STOCK")
		require.Equal(t, []string{"input", "quantity"}, ue.Field)
		require.Contains(t, ue.Message, "2 available")
	})
	t.Run("QUOTA_EXCEEDED", func(t *testing.T) {
		require.Empty(t, e.Reserve(t, alice, map[string]any{"sku": "LIMIT", "quantity": 1}).UserErrors)
		ue := only(t, e.Reserve(t, alice, map[string]any{"sku": "LIMIT", "quantity": 1}), "QUOTA_EXCEEDED")
		require.Contains(t, ue.Message, "limit is 1")
	})
	t.Run("SALE_NOT_ACTIVE", func(t *testing.T) {
		ue := only(t, e.Reserve(t, alice, map[string]any{"sku": "LATER", "quantity": 1}), "SALE_NOT_ACTIVE")
		require.Contains(t, ue.Message, "starts at")
	})
	t.Run("NOT_FOUND", func(t *testing.T) {
		// The refusal names what was not found and the field that named it.
		ue := only(t, e.Reserve(t, alice, map[string]any{"sku": "GHOST", "quantity": 1}), "NOT_FOUND")
		require.Equal(t, `product "GHOST" not found`, ue.Message)
		require.Equal(t, []string{"input", "sku"}, ue.Field)
		ue = only(t, e.Commit(t, alice, "r00.aaaaaaaaaaaaaaaaaaaaaaaaaa"), "NOT_FOUND")
		require.Equal(t, `reservation "r00.aaaaaaaaaaaaaaaaaaaaaaaaaa" not found`, ue.Message)
		require.Equal(t, []string{"input", "token"}, ue.Field)
		ue = only(t, e.Cancel(t, alice, "r00.aaaaaaaaaaaaaaaaaaaaaaaaaa"), "NOT_FOUND")
		require.Equal(t, []string{"input", "token"}, ue.Field)
	})
	t.Run("INVALID_INPUT", func(t *testing.T) {
		ue := only(t, e.Reserve(t, alice, map[string]any{"sku": "TINY", "quantity": 0}), "INVALID_INPUT")
		require.Equal(t, []string{"input", "quantity"}, ue.Field)
		ue = only(t, e.Reserve(t, alice, map[string]any{"sku": "TINY", "quantity": 1, "holdSeconds": 0}), "INVALID_INPUT")
		require.Equal(t, []string{"input", "holdSeconds"}, ue.Field)
		ue = only(t, e.Reserve(t, alice, map[string]any{"sku": "TINY", "quantity": 1, "holdSeconds": 3601}), "INVALID_INPUT")
		require.Equal(t, []string{"input", "holdSeconds"}, ue.Field)
		ue = only(t, e.Commit(t, alice, "not-a-token"), "INVALID_INPUT")
		require.Equal(t, []string{"input", "token"}, ue.Field)
		var out struct{ CreateProduct payload }
		e.MustDo(t, e.Token(t, "admin", true), createDoc, map[string]any{"i": map[string]any{
			"sku": "BAD", "name": "x", "stock": 1, "price": map[string]any{"amount": 1, "currency": "euro"}}}, &out)
		ue = only(t, out.CreateProduct, "INVALID_INPUT")
		require.Equal(t, []string{"input", "price", "currency"}, ue.Field)
	})
	t.Run("IDEMPOTENCY_KEY_REUSED", func(t *testing.T) {
		first := e.Reserve(t, bob, map[string]any{"sku": "TINY", "quantity": 1, "idempotencyKey": "k1"})
		require.Empty(t, first.UserErrors)
		replay := e.Reserve(t, bob, map[string]any{"sku": "TINY", "quantity": 1, "idempotencyKey": "k1"})
		require.Equal(t, first.Reservation.Token, replay.Reservation.Token, "same key, same hold")
		ue := only(t, e.Reserve(t, bob, map[string]any{"sku": "TINY", "quantity": 2, "idempotencyKey": "k1"}), "IDEMPOTENCY_KEY_REUSED")
		require.Equal(t, []string{"input", "idempotencyKey"}, ue.Field)
	})
	t.Run("FORBIDDEN", func(t *testing.T) {
		held := e.Reserve(t, bob, map[string]any{"sku": "OWN", "quantity": 1})
		require.Empty(t, held.UserErrors)
		owner, other := held.Reservation, e.Token(t, "mallory", false)
		only(t, e.Commit(t, other, owner.Token), "FORBIDDEN")
		only(t, e.Cancel(t, other, owner.Token), "FORBIDDEN")
		errs := e.Do(t, other, `query($t: ID!) { reservation(token: $t) { token } }`, map[string]any{"t": owner.Token}, nil)
		require.Len(t, errs, 1)
		require.Equal(t, "FORBIDDEN", errs[0].Code())
		// An admin may cancel anyone's hold.
		require.Empty(t, e.Cancel(t, e.Token(t, "admin", true), owner.Token).UserErrors)
	})
}

func TestCommitAfterExpiryIsExpired(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.CreateProduct(t, map[string]any{"sku": "FLASH", "stock": 1})
	alice := e.Token(t, "alice", false)
	held := e.Reserve(t, alice, map[string]any{"sku": "FLASH", "quantity": 1, "holdSeconds": 1})
	require.Empty(t, held.UserErrors)
	expiresAt := held.Reservation.ExpiresAt
	// Wait for the condition the API reported, not for a fixed time.
	require.Eventually(t, func() bool { return time.Now().After(expiresAt.Add(10 * time.Millisecond)) }, 5*time.Second, 10*time.Millisecond)
	only(t, e.Commit(t, alice, held.Reservation.Token), "EXPIRED")
	var q struct{ Product product }
	e.MustDo(t, "", `{ product(sku: "FLASH") { `+productFields+` } }`, nil, &q)
	require.Equal(t, 1, q.Product.Stock.Available, "the expired unit is back")
}

func TestAdminMutations(t *testing.T) {
	t.Parallel()
	e := setup(t)
	admin, alice := e.Token(t, "admin", true), e.Token(t, "alice", false)
	start := time.Now().Add(time.Hour).UTC().Truncate(time.Second)
	p := e.CreateProduct(t, map[string]any{"sku": "ADM", "stock": 3, "maxPerUser": 2, "saleStartsAt": start.Format(time.RFC3339)})
	require.Equal(t, start, p.SaleStartsAt.UTC())

	var up struct{ UpdateProduct payload }
	e.MustDo(t, admin, updateDoc, map[string]any{"i": map[string]any{
		"sku": "ADM", "name": "Renamed", "price": map[string]any{"amount": 500, "currency": "USD"},
		"maxPerUser": nil, "saleStartsAt": nil}}, &up)
	require.Empty(t, up.UpdateProduct.UserErrors)
	got := up.UpdateProduct.Product
	require.Equal(t, "Renamed", got.Name)
	require.Equal(t, 500, got.Price.Amount)
	require.Nil(t, got.MaxPerUser, "null removes the limit")
	require.Nil(t, got.SaleStartsAt, "null clears the bound")
	require.Empty(t, e.Reserve(t, alice, map[string]any{"sku": "ADM", "quantity": 3}).UserErrors, "the sale is open now")

	var rs struct{ Restock payload }
	e.MustDo(t, admin, restockDoc, map[string]any{"i": map[string]any{"sku": "ADM", "quantity": 7, "eventId": "po-1"}}, &rs)
	require.Empty(t, rs.Restock.UserErrors)
	require.Equal(t, 10, rs.Restock.Product.Stock.Total)
	require.Equal(t, 7, rs.Restock.Product.Stock.Available)
	// The same event id with another quantity, and a total beyond the maximum.
	var reused, over struct{ Restock payload }
	e.MustDo(t, admin, restockDoc, map[string]any{"i": map[string]any{"sku": "ADM", "quantity": 8, "eventId": "po-1"}}, &reused)
	only(t, reused.Restock, "IDEMPOTENCY_KEY_REUSED")
	e.MustDo(t, admin, restockDoc, map[string]any{"i": map[string]any{"sku": "ADM", "quantity": 1_000_000_000, "eventId": "po-big"}}, &over)
	only(t, over.Restock, "INVALID_INPUT")
	// Without an eventId a retry could not be told from a second restock:
	// the schema requires it, and the request is refused before it runs.
	resp, err := e.Client.RawPost(restockDoc, client.AddHeader("Authorization", admin),
		client.Var("i", map[string]any{"sku": "ADM", "quantity": 1}))
	require.NoError(t, err, "a request error over application/json answers 200")
	require.Nil(t, resp.Data, "it never ran")
	require.Contains(t, string(resp.Errors), `"path":["variable","i","eventId"]`)
	require.Contains(t, string(resp.Errors), "GRAPHQL_VALIDATION_FAILED")

	var nf struct{ Restock payload }
	e.MustDo(t, admin, restockDoc, map[string]any{"i": map[string]any{"sku": "NOPE", "quantity": 1, "eventId": "po-1"}}, &nf)
	ue := only(t, nf.Restock, "NOT_FOUND")
	require.Equal(t, `product "NOPE" not found`, ue.Message)
	require.Equal(t, []string{"input", "sku"}, ue.Field)

	for name, doc := range map[string]string{"createProduct": createDoc, "updateProduct": updateDoc, "restock": restockDoc} {
		var in map[string]any
		switch name {
		case "updateProduct":
			in = map[string]any{"sku": "ADM", "name": "hijacked"}
		case "restock":
			in = map[string]any{"sku": "ADM", "quantity": 1, "eventId": "po-2"}
		default:
			in = map[string]any{"sku": "NEW", "name": "x", "stock": 1, "price": map[string]any{"amount": 1, "currency": "EUR"}}
		}
		out := map[string]payload{}
		e.MustDo(t, alice, doc, map[string]any{"i": in}, &out)
		only(t, out[name], "FORBIDDEN")
	}
	var after struct{ Product product }
	e.MustDo(t, "", `{ product(sku: "ADM") { `+productFields+` } }`, nil, &after)
	require.Equal(t, "Renamed", after.Product.Name, "a refused update changed nothing")
	require.Equal(t, 10, after.Product.Stock.Total)
}

func TestMyReservationsPagination(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.CreateProduct(t, map[string]any{"sku": "MANY", "stock": 100})
	alice, bob := e.Token(t, "alice", false), e.Token(t, "bob", false)
	var tokens []string
	for range 5 {
		p := e.Reserve(t, alice, map[string]any{"sku": "MANY", "quantity": 1})
		require.Empty(t, p.UserErrors)
		// Commits reach the ledger synchronously; plain holds arrive through
		// the write-behind worker, which does not run here.
		require.Empty(t, e.Commit(t, alice, p.Reservation.Token).UserErrors)
		tokens = append([]string{p.Reservation.Token}, tokens...) // newest first
	}
	require.Empty(t, e.Reserve(t, bob, map[string]any{"sku": "MANY", "quantity": 1}).UserErrors)

	doc := `query($n: Int, $a: String, $s: ReservationStatus) { myReservations(first: $n, after: $a, status: $s) {
		edges { cursor node { token status product { sku } } } pageInfo { hasNextPage hasPreviousPage endCursor } } }`
	type page struct {
		MyReservations struct {
			Edges []struct {
				Cursor string
				Node   struct {
					Token, Status string
					Product       struct{ Sku string }
				}
			}
			PageInfo struct {
				HasNextPage, HasPreviousPage bool
				EndCursor                    *string
			}
		}
	}
	var seen []string
	var after any
	for {
		var p page
		e.MustDo(t, alice, doc, map[string]any{"n": 2, "a": after, "s": "COMMITTED"}, &p)
		for _, edge := range p.MyReservations.Edges {
			require.Equal(t, "MANY", edge.Node.Product.Sku)
			seen = append(seen, edge.Node.Token)
		}
		if !p.MyReservations.PageInfo.HasNextPage {
			break
		}
		after = *p.MyReservations.PageInfo.EndCursor
	}
	require.Equal(t, tokens, seen)

	var none page
	e.MustDo(t, alice, doc, map[string]any{"s": "CANCELLED"}, &none)
	require.Empty(t, none.MyReservations.Edges)

	errs := e.Do(t, "", doc, nil, nil)
	require.Len(t, errs, 1)
	require.Equal(t, "UNAUTHENTICATED", errs[0].Code())
}

func TestRateLimitedMutations(t *testing.T) {
	t.Parallel()
	e := setup(t, func(c *graphql.Config) {
		c.Limits.MutationRate, c.Limits.MutationPeriod, c.Limits.MutationBurst = 1, time.Minute, 2
	})
	e.CreateProduct(t, map[string]any{"sku": "HOT", "stock": 100})
	alice := e.Token(t, "alice", false)
	require.Empty(t, e.Reserve(t, alice, map[string]any{"sku": "HOT", "quantity": 1}).UserErrors)
	require.Empty(t, e.Reserve(t, alice, map[string]any{"sku": "HOT", "quantity": 1}).UserErrors)
	ue := only(t, e.Reserve(t, alice, map[string]any{"sku": "HOT", "quantity": 1}), "RATE_LIMITED")
	require.NotNil(t, ue.RetryAfterSeconds)
	require.InDelta(t, 30, *ue.RetryAfterSeconds, 31)
	require.Contains(t, ue.Message, "retry in")
	// The budget is per principal.
	require.Empty(t, e.Reserve(t, e.Token(t, "bob", false), map[string]any{"sku": "HOT", "quantity": 1}).UserErrors)
	var q struct{ Product product }
	e.MustDo(t, "", `{ product(sku: "HOT") { `+productFields+` } }`, nil, &q)
	require.Equal(t, 3, q.Product.Stock.Held, "the refused reserve held nothing")
}

// With Postgres gone, ledger-backed calls answer UNAVAILABLE, never a panic
// or an internal error.
func TestUnavailable(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.Pool.Close()
	var out struct{ CreateProduct payload }
	e.MustDo(t, e.Token(t, "admin", true), createDoc, map[string]any{"i": map[string]any{
		"sku": "X", "name": "x", "stock": 1, "price": map[string]any{"amount": 1, "currency": "EUR"}}}, &out)
	ue := only(t, out.CreateProduct, "UNAVAILABLE")
	require.NotContains(t, ue.Message, "closed", "store errors stay in the log")
	errs := e.Do(t, "", `{ products { edges { cursor } } }`, nil, nil)
	require.Len(t, errs, 1)
	require.Equal(t, "UNAVAILABLE", errs[0].Code())
}

// A value the schema's scalars cannot read is the client's mistake, not an
// internal error.
func TestUnreadableScalarIsBadUserInput(t *testing.T) {
	t.Parallel()
	e := setup(t)
	errs := e.Do(t, e.Token(t, "admin", true), `mutation { createProduct(input: {sku: "T", name: "t", stock: 1,
		price: {amount: 1, currency: "EUR"}, saleStartsAt: "yesterday"}) { userErrors { code } } }`, nil, nil)
	require.NotEmpty(t, errs)
	require.Equal(t, "BAD_USER_INPUT", errs[0].Code(), errs[0].Message)
}
