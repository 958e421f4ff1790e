package resolvers_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/auth"
	"github.com/dropline/dropline/internal/graphqltest"
)

// Every kind of bad credential is refused with 401 UNAUTHENTICATED before
// anything runs, whatever the request asks (a mutation, an identity-bound
// query, the public catalogue), and nothing is reserved or created; no
// token at all is an anonymous caller, whose mutations get the userError
// UNAUTHENTICATED while the catalogue still answers.
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

	anonymous := only(t, e.Reserve(t, "", map[string]any{"sku": "AUTH", "quantity": 1}), "UNAUTHENTICATED")
	require.Contains(t, anonymous.Message, "needs a bearer token")
	var created struct{ CreateProduct payload }
	e.MustDo(t, "", createDoc, map[string]any{"i": map[string]any{
		"sku": "EVIL", "name": "x", "stock": 1, "price": map[string]any{"amount": 1, "currency": "EUR"}}}, &created)
	only(t, created.CreateProduct, "UNAUTHENTICATED")

	cases := map[string]struct{ header, message string }{
		"bad signature": {"Bearer " + forged, "not valid"},
		"expired":       {"Bearer " + old, "expired"},
		"alg none":      {"Bearer " + none, "not valid"},
		"not bearer":    {"Basic YWxpY2U6cHc=", "not valid"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			for _, doc := range []string{
				`mutation { reserve(input: {sku: "AUTH", quantity: 1}) { userErrors { code } } }`,
				`mutation { createProduct(input: {sku: "EVIL", name: "x", stock: 1, price: {amount: 1, currency: "EUR"}}) { userErrors { code } } }`,
				`{ myReservations { edges { cursor } } }`,
				`{ product(sku: "AUTH") { sku } }`,
			} {
				body, err := json.Marshal(map[string]any{"query": doc})
				require.NoError(t, err)
				req := httptest.NewRequest(http.MethodPost, "/graphql", bytes.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Authorization", c.header)
				rec := httptest.NewRecorder()
				e.Handler.ServeHTTP(rec, req)
				require.Equal(t, http.StatusUnauthorized, rec.Code, doc)
				require.True(t, strings.HasPrefix(rec.Header().Get("WWW-Authenticate"), `Bearer error="invalid_token"`), rec.Header().Get("WWW-Authenticate"))
				var out struct {
					Data   json.RawMessage        `json:"data"`
					Errors []graphqltest.GQLError `json:"errors"`
				}
				require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &out), rec.Body.String())
				require.Nil(t, out.Data, "nothing ran")
				require.Len(t, out.Errors, 1)
				require.Equal(t, "UNAUTHENTICATED", out.Errors[0].Code())
				require.Contains(t, out.Errors[0].Message, c.message)
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
