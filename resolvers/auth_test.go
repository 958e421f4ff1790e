package resolvers_test

import (
	"encoding/base64"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/auth"
)

// Every kind of bad credential gets UNAUTHENTICATED on a mutation, and
// nothing is reserved; a bad token is never treated as anonymous.
func TestMutationAuth(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.CreateProduct(t, map[string]any{"sku": "AUTH", "stock": 5})

	other, err := auth.NewIssuer([]byte("another-secret-of-thirty-two-byte"))
	require.NoError(t, err)
	forged, err := other.Mint("alice", true, time.Hour)
	require.NoError(t, err)
	old, err := e.Issuer.WithClock(func() time.Time { return time.Now().Add(-2 * time.Hour) }).Mint("alice", false, time.Hour)
	require.NoError(t, err)
	enc := base64.RawURLEncoding.EncodeToString
	none := enc([]byte(`{"alg":"none","typ":"JWT"}`)) + "." +
		enc([]byte(`{"sub":"alice","role":"admin","exp":`+itoa(time.Now().Add(time.Hour).Unix())+`}`)) + "."

	cases := map[string]struct{ header, message string }{
		"no token":      {"", "needs a bearer token"},
		"bad signature": {"Bearer " + forged, "not valid"},
		"expired":       {"Bearer " + old, "expired"},
		"alg none":      {"Bearer " + none, "not valid"},
		"not bearer":    {"Basic YWxpY2U6cHc=", "not valid"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			ue := only(t, e.Reserve(t, c.header, map[string]any{"sku": "AUTH", "quantity": 1}), "UNAUTHENTICATED")
			require.Contains(t, ue.Message, c.message)
			var out struct{ CreateProduct payload }
			e.MustDo(t, c.header, createDoc, map[string]any{"i": map[string]any{
				"sku": "EVIL", "name": "x", "stock": 1, "price": map[string]any{"amount": 1, "currency": "EUR"}}}, &out)
			only(t, out.CreateProduct, "UNAUTHENTICATED")
			if c.header != "" {
				// Identity-bound queries refuse a bad token rather than
				// answering as anonymous.
				errs := e.Do(t, c.header, `{ myReservations { edges { cursor } } }`, nil, nil)
				require.Len(t, errs, 1)
				require.Equal(t, "UNAUTHENTICATED", errs[0].Code())
				// The public catalogue still answers.
				e.MustDo(t, c.header, `{ product(sku: "AUTH") { sku } }`, nil, nil)
			}
		})
	}
	var q struct {
		Product  product
		Product2 *product
	}
	e.MustDo(t, "", `{ product(sku: "AUTH") { `+productFields+` } product2: product(sku: "EVIL") { sku } }`, nil, &q)
	require.Equal(t, 0, q.Product.Stock.Held, "no refused caller reserved anything")
	require.Nil(t, q.Product2, "no refused caller created anything")
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
