package graphql_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/internal/clientaddr"
	"github.com/dropline/dropline/server/graphql"
)

// A persisted query is registered only once it has parsed, validated and
// passed every limit: junk, invalid documents and refused operations sent
// with their correct hash leave nothing in Redis. A query longer than
// APQQueryBytes runs unregistered, and one client address registers at
// most APQBytesPerAddr bytes (each registration charged its length plus a
// key's cost), while another address still registers; a query registered
// already costs nothing.
func TestPersistedQueriesAreRegisteredOnlyWhenTheyRun(t *testing.T) {
	t.Parallel()
	e := setup(t, func(c *graphql.Config) {
		c.Limits.APQQueryBytes = 2000
		c.Limits.APQBytesPerAddr = 3000
		c.Limits.Depth = 4
	})
	e.CreateProduct(t, map[string]any{"sku": "APQ-R", "stock": 1})
	h := clientaddr.Resolver{}.Middleware(e.Handler)
	type result struct {
		Data   map[string]any `json:"data"`
		Errors []gqlError     `json:"errors"`
	}
	send := func(from, query string, withQuery bool) result {
		t.Helper()
		sum := sha256.Sum256([]byte(query))
		m := map[string]any{"extensions": map[string]any{"persistedQuery": map[string]any{"version": 1, "sha256Hash": hex.EncodeToString(sum[:])}}}
		if withQuery {
			m["query"] = query
		}
		b, err := json.Marshal(m)
		require.NoError(t, err)
		req := httptest.NewRequest(http.MethodPost, "/graphql", bytes.NewReader(b))
		req.RemoteAddr = from + ":40000"
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
		var r result
		require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &r), rec.Body.String())
		return r
	}
	keys := func() int {
		t.Helper()
		ks, err := e.Redis.Keys(t.Context(), e.Prefix+"apq:*").Result()
		require.NoError(t, err)
		return len(ks)
	}
	code := func(r result) string {
		t.Helper()
		require.Len(t, r.Errors, 1)
		return r.Errors[0].Code()
	}

	for name, c := range map[string]struct{ query, code string }{
		"junk":          {strings.Repeat("junk ", 300), "GRAPHQL_PARSE_FAILED"},
		"unknown field": {`{ nothing }`, "GRAPHQL_VALIDATION_FAILED"},
		"too deep":      {`{ products { edges { node { stock { sku } } } } }`, graphql.CodeQueryTooDeep},
	} {
		require.Equal(t, c.code, code(send("192.0.2.1", c.query, true)), name)
		require.Equal(t, graphql.CodePersistedQueryNotFound, code(send("192.0.2.1", c.query, false)), "%s: nothing registered", name)
	}
	require.Zero(t, keys(), "refused documents registered nothing")

	// A query over the size bound runs and stays unregistered.
	long := `{ product(sku: "APQ-R") { sku } } # ` + strings.Repeat("x", 2000)
	require.Equal(t, "APQ-R", send("192.0.2.1", long, true).Data["product"].(map[string]any)["sku"])
	require.Equal(t, graphql.CodePersistedQueryNotFound, code(send("192.0.2.1", long, false)))

	// Queries of about 1,000 bytes: 192.0.2.1's budget of 3,000 takes two.
	query := func(i int) string {
		return fmt.Sprintf(`{ product(sku: "APQ-R") { sku } } # %d %s`, i, strings.Repeat("y", 1000))
	}
	for i := range 4 {
		r := send("192.0.2.1", query(i), true)
		require.Empty(t, r.Errors, "every query runs, registered or not")
	}
	registered := 0
	for i := range 4 {
		if r := send("192.0.2.1", query(i), false); len(r.Errors) == 0 {
			registered++
		} else {
			require.Equal(t, graphql.CodePersistedQueryNotFound, code(r))
		}
	}
	require.Equal(t, 2, registered, "one address registers within its budget")
	require.Equal(t, 2, keys())

	// Another address has a budget of its own; an IPv6 client's is its /64's.
	require.Empty(t, send("192.0.2.2", query(3), true).Errors)
	require.Empty(t, send("192.0.2.1", query(3), false).Errors, "registered by the other address, known to all")
	require.Empty(t, send("2001:db8:0:1::1", query(4), true).Errors)
	require.Empty(t, send("2001:db8:0:1::2", query(5), true).Errors)
	require.Empty(t, send("2001:db8:0:1::3", query(6), true).Errors)
	require.Equal(t, 5, keys(), "the /64 registered two of its three")

	// A query registered already is not charged again.
	spent, err := e.Redis.Get(t.Context(), e.Prefix+"apqbudget:192.0.2.2").Int()
	require.NoError(t, err)
	require.Empty(t, send("192.0.2.2", query(0), true).Errors)
	again, err := e.Redis.Get(t.Context(), e.Prefix+"apqbudget:192.0.2.2").Int()
	require.NoError(t, err)
	require.Equal(t, spent, again)
}
