package graphql_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/server/graphql"
)

type httpResult struct {
	status     int
	header     http.Header
	Data       map[string]any `json:"data"`
	Errors     []gqlError     `json:"errors"`
	Extensions map[string]any `json:"extensions"`
}

// post sends a raw JSON body to the handler over a real HTTP connection.
func post(t *testing.T, srv *httptest.Server, authz string, body []byte, header map[string]string) httpResult {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, srv.URL, bytes.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	if authz != "" {
		req.Header.Set("Authorization", authz)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	return send(t, req)
}

func send(t *testing.T, req *http.Request) httpResult {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	res := httpResult{status: resp.StatusCode, header: resp.Header}
	if len(b) > 0 && strings.Contains(resp.Header.Get("Content-Type"), "json") {
		require.NoError(t, json.Unmarshal(b, &res), string(b))
	}
	return res
}

func body(t *testing.T, query string, vars map[string]any) []byte {
	t.Helper()
	b, err := json.Marshal(map[string]any{"query": query, "variables": vars})
	require.NoError(t, err)
	return b
}

func stockOf(t *testing.T, e *env, sku string) stock {
	t.Helper()
	var q struct{ Product product }
	e.MustDo(t, "", `query($s: ID!) { product(sku: $s) { `+productFields+` } }`, map[string]any{"s": sku}, &q)
	return q.Product.Stock
}

// aliasBomb is one mutation with n aliased reserves.
func aliasBomb(n int) string {
	var b strings.Builder
	b.WriteString("mutation($i: ReserveInput!) {")
	for i := range n {
		fmt.Fprintf(&b, " a%d: reserve(input: $i) { __typename }", i)
	}
	b.WriteString(" }")
	return b.String()
}

func TestAliasBombIsRefusedWhole(t *testing.T) {
	t.Parallel()
	for name, mod := range map[string]func(*graphql.Config){
		"default limits":       func(*graphql.Config) {},
		"parser allows it all": func(c *graphql.Config) { c.Limits.ParserTokens = 1 << 20; c.Limits.Complexity = 1 << 20 },
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := setup(t, mod)
			e.CreateProduct(t, map[string]any{"sku": "BOMB", "stock": 5000})
			srv := httptest.NewServer(e.Handler)
			defer srv.Close()
			alice := e.Token(t, "alice", false)
			res := post(t, srv, alice, body(t, aliasBomb(1000), map[string]any{"i": map[string]any{"sku": "BOMB", "quantity": 1}}), nil)
			require.Nil(t, res.Data["a0"])
			require.Len(t, res.Errors, 1)
			t.Logf("refused with %q: %s", res.Errors[0].Code(), res.Errors[0].Message)
			require.NotEqual(t, "INTERNAL", res.Errors[0].Code())
			if name == "parser allows it all" {
				require.Equal(t, "TOO_MANY_MUTATIONS", res.Errors[0].Code(), res.Errors[0].Message)
			}
			require.Equal(t, 0, stockOf(t, e, "BOMB").Held, "nothing executed")

			// Just over the cap is refused too; at the cap it runs.
			res = post(t, srv, alice, body(t, aliasBomb(11), map[string]any{"i": map[string]any{"sku": "BOMB", "quantity": 1}}), nil)
			require.Len(t, res.Errors, 1)
			require.Equal(t, "TOO_MANY_MUTATIONS", res.Errors[0].Code())
			require.Equal(t, 0, stockOf(t, e, "BOMB").Held)
			res = post(t, srv, alice, body(t, aliasBomb(10), map[string]any{"i": map[string]any{"sku": "BOMB", "quantity": 1}}), nil)
			require.Empty(t, res.Errors)
			require.Equal(t, 10, stockOf(t, e, "BOMB").Held)
		})
	}
}

func TestDepthLimit(t *testing.T) {
	t.Parallel()
	e := setup(t, func(c *graphql.Config) { c.Limits.Depth = 4 })
	srv := httptest.NewServer(e.Handler)
	defer srv.Close()
	alice := e.Token(t, "alice", false)

	// Depth 6 through a fragment: fragments add no depth, but their fields do.
	deep := `fragment R on Reservation { product { stock { available } } }
		{ myReservations { edges { node { ...R } } } }`
	res := post(t, srv, alice, body(t, deep, nil), nil)
	require.Len(t, res.Errors, 1)
	require.Equal(t, "QUERY_TOO_DEEP", res.Errors[0].Code())
	require.Nil(t, res.Data)

	res = post(t, srv, alice, body(t, `{ myReservations { edges { node { token } } } }`, nil), nil)
	require.Empty(t, res.Errors, "depth 4 is allowed")

	// A document nested thousands of levels deep is refused by the parser's
	// token limit without a panic.
	bomb := strings.Repeat("{ a ", 5000) + strings.Repeat("}", 5000)
	res = post(t, srv, "", body(t, bomb, nil), nil)
	require.NotEmpty(t, res.Errors)
	require.Less(t, res.status, 500)
}

func TestComplexityLimit(t *testing.T) {
	t.Parallel()
	e := setup(t, func(c *graphql.Config) { c.Limits.Complexity = 50 })
	res := e.Do(t, "", `{ products(first: 100) { edges { node { sku name stock { available } } } } }`, nil, nil)
	require.Len(t, res, 1)
	require.Equal(t, "COMPLEXITY_LIMIT_EXCEEDED", res[0].Code())
	require.Empty(t, e.Do(t, "", `{ products(first: 5) { edges { node { sku } } } }`, nil, nil))
}

// The complexity of an operation is remembered per parsed document only
// when its variables cannot change it: the same document priced by a
// variable is priced again for each request, and one over the limit is
// refused every time.
func TestComplexityIsRememberedOnlyWhereVariablesCannotChangeIt(t *testing.T) {
	t.Parallel()
	e := setup(t, func(c *graphql.Config) { c.Limits.Complexity = 50 })
	paged := `query($n: Int) { products(first: $n) { edges { node { sku name stock { available } } } } }`
	for range 2 {
		require.Empty(t, e.Do(t, "", paged, map[string]any{"n": 2}, nil))
		res := e.Do(t, "", paged, map[string]any{"n": 100}, nil)
		require.Len(t, res, 1)
		require.Equal(t, "COMPLEXITY_LIMIT_EXCEEDED", res[0].Code())
	}
	fragment := `query($n: Int) { ...page } fragment page on Query { products(first: $n) { edges { node { sku name stock { available } } } } }`
	require.Empty(t, e.Do(t, "", fragment, map[string]any{"n": 2}, nil))
	require.Equal(t, "COMPLEXITY_LIMIT_EXCEEDED", e.Do(t, "", fragment, map[string]any{"n": 100}, nil)[0].Code())
	fixed := `query($sku: ID!) { product(sku: $sku) { sku } products(first: 100) { edges { node { sku name stock { available } } } } }`
	for range 2 {
		res := e.Do(t, "", fixed, map[string]any{"sku": "A"}, nil)
		require.Len(t, res, 1)
		require.Equal(t, "COMPLEXITY_LIMIT_EXCEEDED", res[0].Code())
		require.Equal(t, "operation has complexity 603, which exceeds the limit of 50", res[0].Message)
	}
	small := `query($sku: ID!) { product(sku: $sku) { sku } }`
	for _, sku := range []string{"A", "B"} {
		require.Empty(t, e.Do(t, "", small, map[string]any{"sku": sku}, nil))
	}
}

func TestOversizedBody(t *testing.T) {
	t.Parallel()
	e := setup(t, func(c *graphql.Config) { c.Limits.BodyBytes = 4096 })
	srv := httptest.NewServer(e.Handler)
	defer srv.Close()
	big := body(t, "{ products { edges { cursor } } }", map[string]any{"pad": strings.Repeat("x", 5000)})

	res := post(t, srv, "", big, nil)
	require.Equal(t, http.StatusRequestEntityTooLarge, res.status)
	require.Equal(t, "PAYLOAD_TOO_LARGE", res.Errors[0].Code())

	// Without a Content-Length (chunked), the limit still holds.
	req, err := http.NewRequest(http.MethodPost, srv.URL, io.MultiReader(bytes.NewReader(big)))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.ContentLength = -1
	require.Equal(t, http.StatusRequestEntityTooLarge, send(t, req).status)

	require.Equal(t, http.StatusOK, post(t, srv, "", body(t, "{ products { edges { cursor } } }", nil), nil).status)
}

func TestTransports(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.CreateProduct(t, map[string]any{"sku": "GET", "stock": 3})
	srv := httptest.NewServer(e.Handler)
	defer srv.Close()
	alice := e.Token(t, "alice", false)

	get := func(query string) httpResult {
		req, err := http.NewRequest(http.MethodGet, srv.URL+"?query="+url.QueryEscape(query), nil)
		require.NoError(t, err)
		req.Header.Set("Authorization", alice)
		return send(t, req)
	}
	res := get(`{ product(sku: "GET") { sku } }`)
	require.Equal(t, http.StatusOK, res.status)
	require.Equal(t, map[string]any{"sku": "GET"}, res.Data["product"])

	res = get(`mutation { reserve(input: {sku: "GET", quantity: 1}) { userErrors { code } } }`)
	require.Equal(t, http.StatusMethodNotAllowed, res.status, "the specification's answer to a mutation over GET")
	require.Equal(t, http.MethodPost, res.header.Get("Allow"))
	require.Equal(t, "BAD_REQUEST", res.Errors[0].Code())
	require.Equal(t, 0, stockOf(t, e, "GET").Held, "GET never mutates")

	// A cross-site HTML form cannot post JSON: other content types never
	// reach GraphQL.
	req, err := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(`query=mutation{reserve(input:{sku:"GET",quantity:1}){__typename}}`))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Authorization", alice)
	require.Equal(t, http.StatusBadRequest, send(t, req).status)
	require.Equal(t, 0, stockOf(t, e, "GET").Held)
}

// TestRequestErrorsOverHTTP pins what the GraphQL over HTTP specification
// asks of a request that never executes: 200 when the client accepts
// application/json (only a request that is not well-formed gets 400), 400
// when it accepts application/graphql-response+json, and no data entry
// (not even null) with either.
func TestRequestErrorsOverHTTP(t *testing.T) {
	t.Parallel()
	e := setup(t, func(c *graphql.Config) { c.Limits.Complexity = 50 })
	srv := httptest.NewServer(e.Handler)
	defer srv.Close()

	do := func(method, accept, raw string) (int, string, map[string]json.RawMessage) {
		var req *http.Request
		var err error
		if method == http.MethodGet {
			var m map[string]any
			require.NoError(t, json.Unmarshal([]byte(raw), &m))
			v := url.Values{}
			for k, x := range m {
				if s, ok := x.(string); ok {
					v.Set(k, s)
				} else {
					b, _ := json.Marshal(x)
					v.Set(k, string(b))
				}
			}
			req, err = http.NewRequest(method, srv.URL+"?"+v.Encode(), nil)
		} else {
			req, err = http.NewRequest(method, srv.URL, strings.NewReader(raw))
			req.Header.Set("Content-Type", "application/json")
		}
		require.NoError(t, err)
		if accept != "" {
			req.Header.Set("Accept", accept)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		var out map[string]json.RawMessage
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
		return resp.StatusCode, resp.Header.Get("Content-Type"), out
	}

	notExecuted := map[string]string{
		"parse":      `{"query": "{"}`,
		"validation": `{"query": "{ nope }"}`,
		"coercion":   `{"query": "query($s: ID!) { product(sku: $s) { sku } }", "variables": {"s": {"a": 1}}}`,
		"complexity": `{"query": "{ products(first: 100) { edges { node { sku name } } } }"}`,
		"apq miss":   `{"extensions": {"persistedQuery": {"version": 1, "sha256Hash": "` + strings.Repeat("0", 64) + `"}}}`,
	}
	for name, raw := range notExecuted {
		for _, method := range []string{http.MethodPost, http.MethodGet} {
			for accept, want := range map[string]int{
				"":                                  http.StatusOK,
				"application/json":                  http.StatusOK,
				"*/*":                               http.StatusOK,
				"application/graphql-response+json": http.StatusBadRequest,
				"application/graphql-response+json, application/json;q=0.9": http.StatusBadRequest,
			} {
				status, ct, out := do(method, accept, raw)
				require.Equal(t, want, status, "%s %s accepting %q", name, method, accept)
				if want == http.StatusOK {
					require.Equal(t, "application/json", ct)
				} else {
					require.Equal(t, "application/graphql-response+json", ct)
				}
				require.NotContains(t, out, "data", "%s %s accepting %q: it never executed", name, method, accept)
				require.NotEmpty(t, out["errors"])
			}
		}
	}

	// Not well-formed: 400 whatever is accepted.
	for _, raw := range []string{`{"qeury": "{ __typename }"}`, `{"query": 1}`, `[]`, `{`} {
		for _, accept := range []string{"application/json", "application/graphql-response+json"} {
			status, _, out := do(http.MethodPost, accept, raw)
			require.Equal(t, http.StatusBadRequest, status, "%s accepting %s", raw, accept)
			require.NotContains(t, out, "data")
		}
	}

	// Executed: 200 and a data entry, with either media type.
	for _, accept := range []string{"application/json", "application/graphql-response+json"} {
		status, _, out := do(http.MethodPost, accept, `{"query": "{ product(sku: \"NONE\") { sku } }"}`)
		require.Equal(t, http.StatusOK, status)
		require.JSONEq(t, `{"product": null}`, string(out["data"]))
	}
}

func TestCORS(t *testing.T) {
	t.Parallel()
	e := setup(t) // allows https://shop.example
	srv := httptest.NewServer(e.Handler)
	defer srv.Close()
	q := body(t, "{ products { edges { cursor } } }", nil)

	res := post(t, srv, "", q, map[string]string{"Origin": "https://shop.example"})
	require.Equal(t, http.StatusOK, res.status)
	require.Equal(t, "https://shop.example", res.header.Get("Access-Control-Allow-Origin"))
	require.Empty(t, res.header.Get("Access-Control-Allow-Credentials"))

	res = post(t, srv, "", q, map[string]string{"Origin": "https://evil.example"})
	require.Equal(t, http.StatusForbidden, res.status)
	require.Empty(t, res.header.Get("Access-Control-Allow-Origin"))
	require.Equal(t, "ORIGIN_NOT_ALLOWED", res.Errors[0].Code())

	preflight := func(origin string) *http.Response {
		req, err := http.NewRequest(http.MethodOptions, srv.URL, nil)
		require.NoError(t, err)
		req.Header.Set("Origin", origin)
		req.Header.Set("Access-Control-Request-Method", "POST")
		req.Header.Set("Access-Control-Request-Headers", "authorization, content-type")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp
	}
	ok := preflight("https://shop.example") //nolint:bodyclose // closed inside preflight
	require.Equal(t, http.StatusNoContent, ok.StatusCode)
	require.Contains(t, ok.Header.Get("Access-Control-Allow-Methods"), "POST")
	require.Contains(t, ok.Header.Get("Access-Control-Allow-Headers"), "Authorization")
	require.Equal(t, http.StatusForbidden, preflight("https://evil.example").StatusCode) //nolint:bodyclose // closed inside preflight

	// What real clients ask for: a browser refuses the request unless every
	// header in Access-Control-Request-Headers is allowed (case-insensitive).
	for client, headers := range map[string]string{
		"Apollo Client with clientAwareness": "apollographql-client-name,apollographql-client-version,authorization,content-type",
		"Apollo Client, CSRF-safe uploads":   "apollo-require-preflight,x-apollo-operation-name,content-type",
		"graphql-sse in reservation mode":    "x-graphql-event-stream-token,accept,authorization",
		"traced frontends":                   "traceparent,tracestate,baggage,sentry-trace,x-request-id",
	} {
		req, err := http.NewRequest(http.MethodOptions, srv.URL, nil)
		require.NoError(t, err)
		req.Header.Set("Origin", "https://shop.example")
		req.Header.Set("Access-Control-Request-Method", "POST")
		req.Header.Set("Access-Control-Request-Headers", headers)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
		require.Equal(t, http.StatusNoContent, resp.StatusCode, client)
		allowed := map[string]bool{}
		for _, h := range strings.Split(resp.Header.Get("Access-Control-Allow-Headers"), ",") {
			allowed[strings.ToLower(strings.TrimSpace(h))] = true
		}
		for _, h := range strings.Split(headers, ",") {
			require.True(t, allowed[h], "%s: preflight does not allow %q (allowed: %s)", client, h, resp.Header.Get("Access-Control-Allow-Headers"))
		}
	}

	// Same-origin and non-browser requests need no listing.
	host := strings.TrimPrefix(srv.URL, "http://")
	require.Equal(t, http.StatusOK, post(t, srv, "", q, map[string]string{"Origin": "http://" + host}).status)
	require.Equal(t, http.StatusOK, post(t, srv, "", q, nil).status)
}

func TestAutomaticPersistedQueries(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.CreateProduct(t, map[string]any{"sku": "APQ", "stock": 1})
	srv := httptest.NewServer(e.Handler)
	defer srv.Close()
	query := `{ product(sku: "APQ") { sku } }`
	sum := sha256.Sum256([]byte(query))
	hash := hex.EncodeToString(sum[:])
	ext := map[string]any{"persistedQuery": map[string]any{"version": 1, "sha256Hash": hash}}
	send := func(withQuery bool) httpResult {
		m := map[string]any{"extensions": ext}
		if withQuery {
			m["query"] = query
		}
		b, err := json.Marshal(m)
		require.NoError(t, err)
		return post(t, srv, "", b, nil)
	}

	res := send(false)
	require.Len(t, res.Errors, 1)
	require.Equal(t, "PERSISTED_QUERY_NOT_FOUND", res.Errors[0].Code())

	res = send(true)
	require.Empty(t, res.Errors)
	require.Equal(t, map[string]any{"sku": "APQ"}, res.Data["product"])

	n, err := e.Redis.Exists(t.Context(), e.Prefix+"apq:"+hash).Result()
	require.NoError(t, err)
	require.Equal(t, int64(1), n, "persisted in Redis under the key prefix")

	// Another instance sharing Redis knows the hash too.
	other := graphql.NewHandler(graphql.Config{Engine: e.Engine, Redis: e.Redis, Verifier: e.Issuer})
	srv2 := httptest.NewServer(other)
	defer srv2.Close()
	b, _ := json.Marshal(map[string]any{"extensions": ext})
	res = post(t, srv2, "", b, nil)
	require.Empty(t, res.Errors)
	require.Equal(t, map[string]any{"sku": "APQ"}, res.Data["product"])
}

func TestIntrospectionAndSuggestionsOnlyInDev(t *testing.T) {
	t.Parallel()
	prod := setup(t)
	errs := prod.Do(t, "", `{ __schema { queryType { name } } }`, nil, nil)
	require.NotEmpty(t, errs, "introspection is off outside dev mode")
	t.Logf("introspection refused with %q: %s", errs[0].Code(), errs[0].Message)
	require.Equal(t, "INTROSPECTION_DISABLED", errs[0].Code())
	typo := body(t, `{ prodcts { edges { cursor } } }`, nil)
	prodSrv := httptest.NewServer(prod.Handler)
	defer prodSrv.Close()
	res := post(t, prodSrv, "", typo, nil)
	require.NotEmpty(t, res.Errors)
	require.NotContains(t, res.Errors[0].Message, "Did you mean")

	dev := setup(t, func(c *graphql.Config) { c.Dev = true })
	var out struct {
		Schema struct{ QueryType struct{ Name string } } `json:"__schema"`
	}
	dev.MustDo(t, "", `{ __schema { queryType { name } } }`, nil, &out)
	require.Equal(t, "Query", out.Schema.QueryType.Name)
	devSrv := httptest.NewServer(dev.Handler)
	defer devSrv.Close()
	res = post(t, devSrv, "", typo, nil)
	require.Contains(t, res.Errors[0].Message, "Did you mean")
}

// TestRequestWhoseClientLeftIsDropped: a request whose client has gone (its
// context ended before the operation ran, as when a paused server resumes
// long after the caller gave up) gets nothing written and nothing logged as
// a panic: the executor answers such a request with no response at all.
func TestRequestWhoseClientLeftIsDropped(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.CreateProduct(t, map[string]any{"sku": "GONE", "stock": 3})
	body := `{"query":"mutation { reserve(input: {sku: \"GONE\", quantity: 1}) { userErrors { code } } }"}`
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	req := httptest.NewRequestWithContext(ctx, http.MethodPost, "/", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", e.Token(t, "alice", false))
	rec := httptest.NewRecorder()
	e.Handler.ServeHTTP(rec, req)
	require.NotContains(t, e.Logs.String(), "panic", "a request whose client left is not a panic")
	require.NotContains(t, rec.Body.String(), "INTERNAL")
	require.Zero(t, stockOf(t, e, "GONE").Held, "nothing ran for a client that left")
}
