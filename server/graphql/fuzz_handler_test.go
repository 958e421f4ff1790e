package graphql_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/dropline/dropline/auth"
	"github.com/dropline/dropline/internal/testenv"
	"github.com/dropline/dropline/inventory"
	"github.com/dropline/dropline/server"
	"github.com/dropline/dropline/server/graphql"
)

// FuzzGraphQLRequest posts arbitrary GraphQL documents and variables to the
// real handler over real Redis and Postgres, as an authenticated buyer:
// never a 5xx, never an INTERNAL error, never a panic in the log, and the
// stock stays balanced.
func FuzzGraphQLRequest(f *testing.F) {
	pool := testenv.Postgres(f)
	r := testenv.Redis(f)
	ctx := context.Background()
	eng, err := inventory.NewEngine(ctx, inventory.Config{KeyPrefix: r.Prefix}, r.Client, pool, zerolog.Nop())
	if err != nil {
		f.Fatal(err)
	}
	const sku, total = "FUZZ-GQL", 1000
	if _, err := eng.Catalog().CreateProduct(ctx, inventory.Principal{ID: "ops", Admin: true}, inventory.ProductInput{
		SKU: sku, Name: "Fuzz", Price: inventory.Money{Amount: 1, Currency: "EUR"}, Stock: total}); err != nil {
		f.Fatal(err)
	}
	iss, err := auth.NewIssuer(secret)
	if err != nil {
		f.Fatal(err)
	}
	logs := &testenv.LogBuffer{}
	h := server.RequestID(zerolog.New(logs), graphql.NewHandler(graphql.Config{Engine: eng, Redis: r.Client, Verifier: iss,
		Limits: graphql.Limits{MutationRate: -1}}))
	bearer, err := iss.Mint("fuzzer", false, time.Hour)
	if err != nil {
		f.Fatal(err)
	}
	for _, seed := range [][2]string{
		{`query { product(sku: "FUZZ-GQL") { sku stock { available held sold total } } }`, `{}`},
		{`mutation($i: ReserveInput!) { reserve(input: $i) { reservation { token } userErrors { code } } }`, `{"i":{"sku":"FUZZ-GQL","quantity":1,"holdSeconds":1}}`},
		{`mutation($i: ReserveInput!) { reserve(input: $i) { userErrors { code } } }`, `{"i":{"sku":"FUZZ-GQL","quantity":-1}}`},
		{`mutation($t: ID!) { commit(input: {token: $t}) { userErrors { code } } }`, `{"t":"r07.aaaaaaaaaaaaaaaaaaaaaaaaaa"}`},
		{`mutation($t: ID!) { cancel(input: {token: $t}) { userErrors { code } } }`, `{"t":"nope"}`},
		{`query { products(first: 1000) { edges { node { sku } } } }`, `null`},
		{`query { myReservations(first: 5, after: "!!") { edges { node { token } } } }`, `[]`},
		{`query { node(id: "UHJvZHVjdDpGVVpaLUdRTA==") { id ... on Product { sku } } }`, `{"x":1}`},
		{`query { reservation(token: "r99.x") { status } }`, `{}`},
		{`{ __schema { types { name } } }`, ``},
		{`query { product(sku: "FUZZ-GQL") { stock { ...F } } } fragment F on Stock { ...F }`, `{}`},
		{`mutation { a: restock(input: {sku: "FUZZ-GQL", quantity: 1, eventId: "fuzz"}) { userErrors { code } } }`, `{}`},
		{"query { product(sku: \"\xff\") { sku } }", `{}`},
		{`subscription { stock(sku: "FUZZ-GQL") { available } }`, `{}`},
		{strings.Repeat("{", 500), `{}`},
	} {
		f.Add(seed[0], seed[1])
	}
	f.Fuzz(func(t *testing.T, query, variables string) {
		body := map[string]any{"query": query}
		var vars map[string]any
		if json.Unmarshal([]byte(variables), &vars) == nil && vars != nil {
			body["variables"] = json.RawMessage(variables)
		}
		raw, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		// And the same text spliced in as it is: often a body gqlgen cannot
		// decode at all (variables an array, a string, broken JSON).
		quoted, err := json.Marshal(query)
		if err != nil {
			t.Fatal(err)
		}
		spliced := []byte(`{"query":` + string(quoted) + `,"variables":` + variables + `}`)
		for _, payload := range [][]byte{raw, spliced} {
			req := httptest.NewRequest(http.MethodPost, "/graphql", bytes.NewReader(payload))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Authorization", "Bearer "+bearer)
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code >= 500 {
				t.Fatalf("status %d for %q / %q: %s", rec.Code, query, variables, rec.Body.String())
			}
			if strings.Contains(rec.Body.String(), `"INTERNAL"`) {
				t.Fatalf("internal error for %q / %q: %s", query, variables, rec.Body.String())
			}
		}
		if strings.Contains(strings.ToLower(logs.String()), "panic") {
			t.Fatalf("the handler logged a panic: %s", logs.String())
		}
		s, err := eng.Catalog().Stock(context.Background(), sku)
		if err != nil {
			t.Fatal(err)
		}
		if s.Total != total || s.Available+s.Held+s.Sold != s.Total || s.Available < 0 {
			t.Fatalf("stock out of balance: %+v", s)
		}
	})
}
