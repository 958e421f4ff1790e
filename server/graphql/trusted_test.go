package graphql_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/inventory"
	"github.com/dropline/dropline/live"
	"github.com/dropline/dropline/server/graphql"
)

const (
	trustedProduct = `query Product($sku: ID!) { product(sku: $sku) { sku name stock { available } } }`
	trustedStock   = `subscription Stock($skus: [ID!]!) { stockChanged(skus: $skus) { sku available } }`
	trustedReserve = `mutation Reserve($input: ReserveInput!) { reserve(input: $input) { reservation { sku quantity } userErrors { code } } }`
)

func sha(doc string) string {
	sum := sha256.Sum256([]byte(doc))
	return hex.EncodeToString(sum[:])
}

// apolloManifest is Apollo's persisted query manifest of docs.
func apolloManifest(t *testing.T, docs ...string) []byte {
	t.Helper()
	ops := []map[string]any{}
	for _, d := range docs {
		ops = append(ops, map[string]any{"id": sha(d), "body": d, "name": "x", "type": "query"})
	}
	b, err := json.Marshal(map[string]any{"format": "apollo-persisted-query-manifest", "version": 1, "operations": ops})
	require.NoError(t, err)
	return b
}

// setupTrusted serves docs as the only trusted documents, with SKU
// TRUST-1 in stock.
func setupTrusted(t *testing.T, dev bool, manifest []byte) *liveEnv {
	t.Helper()
	docs, err := graphql.ParseTrustedDocuments(manifest)
	require.NoError(t, err)
	le := setupLive(t, live.HubConfig{}, func(c *graphql.Config) {
		c.TrustedDocuments = docs
		c.Dev = dev
	})
	_, err = le.Engine.Catalog().CreateProduct(t.Context(), inventory.Principal{ID: "ops", Admin: true}, inventory.ProductInput{
		SKU: "TRUST-1", Name: "Trusted", Price: inventory.Money{Amount: 100, Currency: "EUR"}, Stock: 3,
	})
	require.NoError(t, err)
	return le
}

// A server with trusted documents runs the documents its manifest lists,
// named by Apollo's persisted query hash, documentId or doc_id, over POST,
// GET, SSE and websockets, and refuses anything else with a typed error:
// a document sent as text (PERSISTED_QUERY_NOT_ALLOWED, even a listed
// one), an unknown id (PERSISTED_QUERY_NOT_FOUND, then NOT_ALLOWED when
// Apollo's link resends it with its text). Nothing is registered in Redis.
func TestTrustedDocumentsOnly(t *testing.T) {
	t.Parallel()
	le := setupTrusted(t, false, apolloManifest(t, trustedProduct, trustedStock, trustedReserve))
	buyer := le.Token(t, "alice", false)
	vars := map[string]any{"sku": "TRUST-1"}
	postJSON := func(m map[string]any, header map[string]string) httpResult {
		t.Helper()
		b, err := json.Marshal(m)
		require.NoError(t, err)
		return post(t, le.srv, buyer, b, header)
	}
	code := func(r httpResult) string {
		t.Helper()
		require.Len(t, r.Errors, 1, "%+v", r)
		require.Nil(t, r.Data, "nothing ran")
		return r.Errors[0].Code()
	}
	product := func(r httpResult) {
		t.Helper()
		require.Equal(t, http.StatusOK, r.status)
		require.Empty(t, r.Errors)
		require.Equal(t, "TRUST-1", r.Data["product"].(map[string]any)["sku"])
	}

	// By id, every way a client names one.
	product(postJSON(map[string]any{"extensions": map[string]any{"persistedQuery": map[string]any{"version": 1, "sha256Hash": sha(trustedProduct)}}, "variables": vars}, nil))
	product(postJSON(map[string]any{"documentId": sha(trustedProduct), "variables": vars}, nil))
	product(postJSON(map[string]any{"documentId": "sha256:" + sha(trustedProduct), "variables": vars}, nil))
	product(postJSON(map[string]any{"doc_id": sha(trustedProduct), "variables": vars}, nil))
	req, err := http.NewRequest(http.MethodGet, le.srv.URL+"?documentId="+sha(trustedProduct)+"&variables="+url.QueryEscape(`{"sku":"TRUST-1"}`), nil)
	require.NoError(t, err)
	product(send(t, req))
	reserved := postJSON(map[string]any{"documentId": sha(trustedReserve), "variables": map[string]any{"input": map[string]any{"sku": "TRUST-1", "quantity": 1, "idempotencyKey": "t-1"}}}, nil)
	require.Empty(t, reserved.Errors)
	require.Equal(t, "TRUST-1", reserved.Data["reserve"].(map[string]any)["reservation"].(map[string]any)["sku"])

	// Anything else is refused, before it runs.
	r := postJSON(map[string]any{"query": `{ products { edges { node { sku } } } }`}, nil)
	require.Equal(t, http.StatusOK, r.status)
	require.Equal(t, graphql.CodePersistedQueryNotAllowed, code(r))
	r = postJSON(map[string]any{"query": `{ products { edges { node { sku } } } }`}, map[string]string{"Accept": "application/graphql-response+json"})
	require.Equal(t, http.StatusBadRequest, r.status)
	require.Equal(t, graphql.CodePersistedQueryNotAllowed, code(r))
	require.Equal(t, graphql.CodePersistedQueryNotAllowed, code(postJSON(map[string]any{"query": trustedProduct, "variables": vars}, nil)), "a listed document is run by its id only")
	require.Equal(t, graphql.CodePersistedQueryNotAllowed, code(postJSON(map[string]any{"query": trustedReserve, "variables": map[string]any{"input": map[string]any{"sku": "TRUST-1", "quantity": 1}}}, nil)))
	unknown := `{ products { edges { node { sku name } } } }`
	require.Equal(t, graphql.CodePersistedQueryNotFound, code(postJSON(map[string]any{"documentId": sha(unknown)}, nil)))
	apq := map[string]any{"persistedQuery": map[string]any{"version": 1, "sha256Hash": sha(unknown)}}
	r = postJSON(map[string]any{"extensions": apq}, nil)
	require.Equal(t, graphql.CodePersistedQueryNotFound, code(r))
	require.Equal(t, "PersistedQueryNotFound", r.Errors[0].Message, "what Apollo's and urql's links look for")
	require.Equal(t, graphql.CodePersistedQueryNotAllowed, code(postJSON(map[string]any{"query": unknown, "extensions": apq}, nil)), "the link's retry")
	require.Equal(t, graphql.CodePersistedQueryNotAllowed, code(postJSON(map[string]any{"query": unknown, "extensions": apq}, nil)), "and again: nothing was registered")
	keys, err := le.Redis.Keys(t.Context(), le.Prefix+"apq*").Result()
	require.NoError(t, err)
	require.Empty(t, keys, "automatic persisted queries are off")
	require.Equal(t, 2, le.Truth(t, "TRUST-1").Available, "only the listed reserve ran")

	// SSE, by doc_id; and refused as text.
	events := sseBody(t, le.srv.URL, map[string]any{"doc_id": sha(trustedStock), "variables": map[string]any{"skus": []string{"TRUST-1"}}}, 1)
	require.JSONEq(t, `{"data":{"stockChanged":{"sku":"TRUST-1","available":2}}}`, events[0])
	events = sseBody(t, le.srv.URL, map[string]any{"query": `subscription { stockChanged(skus: ["TRUST-1"]) { sku } }`}, 1)
	require.Contains(t, events[0], graphql.CodePersistedQueryNotAllowed)
	events = sseBody(t, le.srv.URL, map[string]any{"documentId": sha(trustedProduct), "variables": vars}, 1)
	require.Contains(t, events[0], `{"data":{"product":{"sku":"TRUST-1","name":"Trusted","stock":{"available":2}}}`, "a query over SSE")

	// Websockets, by documentId and by Apollo's hash; and refused as text.
	msgs := wsPayloads(t, le.wsURL, []map[string]any{
		{"documentId": sha(trustedStock), "variables": map[string]any{"skus": []string{"TRUST-1"}}},
		{"query": "", "extensions": map[string]any{"persistedQuery": map[string]any{"version": 1, "sha256Hash": sha(trustedProduct)}}, "variables": vars},
		{"query": `subscription { stockChanged(skus: ["TRUST-1"]) { sku } }`},
	})
	require.JSONEq(t, `{"data":{"stockChanged":{"sku":"TRUST-1","available":2}}}`, msgs["1"])
	require.Contains(t, msgs["2"], `{"data":{"product":{"sku":"TRUST-1","name":"Trusted","stock":{"available":2}}}`)
	require.Contains(t, msgs["3"], graphql.CodePersistedQueryNotAllowed)
}

// In dev mode a document sent as text still runs (the playground), but is
// not registered; ids work as in production.
func TestTrustedDocumentsInDevModeRunText(t *testing.T) {
	t.Parallel()
	le := setupTrusted(t, true, apolloManifest(t, trustedProduct))
	b := body(t, `{ product(sku: "TRUST-1") { sku } }`, nil)
	r := post(t, le.srv, "", b, nil)
	require.Empty(t, r.Errors)
	require.Equal(t, "TRUST-1", r.Data["product"].(map[string]any)["sku"])
	r = post(t, le.srv, "", []byte(`{"documentId":"`+sha(trustedProduct)+`","variables":{"sku":"TRUST-1"}}`), nil)
	require.Empty(t, r.Errors)
	r = post(t, le.srv, "", []byte(`{"documentId":"nope"}`), nil)
	require.Len(t, r.Errors, 1)
	require.Equal(t, graphql.CodePersistedQueryNotFound, r.Errors[0].Code())
}

// The manifests Relay's compiler and graphql-codegen's client preset write
// (a map of id to document) load as Apollo's does; a manifest that is
// neither, or whose documents do not validate against the schema, does
// not load.
func TestTrustedDocumentManifests(t *testing.T) {
	t.Parallel()
	const name = `query Name($sku: ID!) { product(sku: $sku) { name } }`
	m, err := json.Marshal(map[string]string{"sha256:" + sha(trustedProduct): trustedProduct, "relay-42": name})
	require.NoError(t, err)
	docs, err := graphql.ParseTrustedDocuments(m)
	require.NoError(t, err)
	require.Equal(t, 2, docs.Len())
	for _, bad := range []string{
		``, `[]`, `{}`, `{"a": 1}`,
		`{"format":"apollo-persisted-query-manifest","version":2,"operations":[]}`,
		`{"format":"apollo-persisted-query-manifest","version":1,"operations":[]}`,
		`{"format":"apollo-persisted-query-manifest","version":1,"operations":[{"id":"a","body":""}]}`,
		`{"a": "{ nope }"}`, `{"a": "query {"}`,
	} {
		_, err := graphql.ParseTrustedDocuments([]byte(bad))
		require.Error(t, err, bad)
	}
	le := setupTrusted(t, false, m)
	r := post(t, le.srv, "", []byte(`{"extensions":{"persistedQuery":{"version":1,"sha256Hash":"`+sha(trustedProduct)+`"}},"variables":{"sku":"TRUST-1"}}`), nil)
	require.Empty(t, r.Errors, "a prefixed id is found by its bare hash")
	r = post(t, le.srv, "", []byte(`{"doc_id":"relay-42","variables":{"sku":"TRUST-1"}}`), nil)
	require.Empty(t, r.Errors)
	require.Equal(t, "Trusted", r.Data["product"].(map[string]any)["name"])
}

// sseBody posts m over GraphQL over SSE and returns the first n data lines.
func sseBody(t *testing.T, srvURL string, m map[string]any, n int) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b, err := json.Marshal(m)
	require.NoError(t, err)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, srvURL, bytes.NewReader(b))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var out []string
	sc := bufio.NewScanner(resp.Body)
	for len(out) < n && sc.Scan() {
		if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			out = append(out, data)
		}
	}
	require.Len(t, out, n, "stream ended early: %v", sc.Err())
	return out
}

// wsPayloads subscribes with each payload over graphql-transport-ws (ids
// "1", "2", ...) and returns the first next or error message of each id.
func wsPayloads(t *testing.T, wsURL string, payloads []map[string]any) map[string]string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, resp, err := websocket.Dial(ctx, wsURL, &websocket.DialOptions{Subprotocols: []string{"graphql-transport-ws"}})
	require.NoError(t, err)
	if resp.Body != nil {
		_ = resp.Body.Close()
	}
	defer c.CloseNow()
	write := func(v any) {
		b, _ := json.Marshal(v)
		require.NoError(t, c.Write(ctx, websocket.MessageText, b))
	}
	write(map[string]any{"type": "connection_init"})
	for i, p := range payloads {
		write(map[string]any{"type": "subscribe", "id": string(rune('1' + i)), "payload": p})
	}
	out := map[string]string{}
	for len(out) < len(payloads) {
		_, msg, err := c.Read(ctx)
		require.NoError(t, err)
		var m struct {
			Type    string
			ID      string
			Payload json.RawMessage
		}
		require.NoError(t, json.Unmarshal(msg, &m))
		if _, seen := out[m.ID]; !seen && (m.Type == "next" || m.Type == "error") {
			out[m.ID] = string(m.Payload)
		}
	}
	return out
}
