package graphql_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/live"
	"github.com/dropline/dropline/server/graphql"
)

// answerPair is two /graphql handlers over one engine, whose live hub is
// its sold-out memory: one as served (answering the memory's refusals in
// the HTTP transport), one executing every operation. Each has its own
// metrics and cost budgets, on a clock that does not move, so that the same
// requests leave both in the same state.
type answerPair struct {
	e               *env
	served, execAll http.Handler
	reg             *prometheus.Registry
	cfg             graphql.Config
}

func setupAnswerPair(t *testing.T, limits graphql.Limits) *answerPair {
	t.Helper()
	var cfg graphql.Config
	e := setup(t, func(c *graphql.Config) {
		c.Limits = limits
		hub := live.NewHub(live.HubConfig{}, c.Engine, c.Redis, zerolog.Nop(), prometheus.NewRegistry())
		require.NoError(t, hub.Start(context.Background()))
		t.Cleanup(func() { require.NoError(t, hub.Stop(context.Background())) })
		c.Engine.RememberSoldOut(hub)
		c.Live = hub
		now := time.Now()
		c.Now = func() time.Time { return now }
		cfg = *c
	})
	p := &answerPair{e: e, reg: prometheus.NewRegistry(), cfg: cfg}
	served, execAll := cfg, cfg
	served.Registerer, execAll.Registerer = p.reg, prometheus.NewRegistry()
	p.served, p.execAll = graphql.NewHandler(served), graphql.NewHandlerExecutingAll(execAll)
	return p
}

// postRaw sends one request to h and returns its status, its RateLimit
// header and its body.
func postRaw(t *testing.T, h http.Handler, authz, body string) (int, string, string) {
	t.Helper()
	r := httptest.NewRequest(http.MethodPost, "/graphql", strings.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	if authz != "" {
		r.Header.Set("Authorization", authz)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w.Code, w.Header().Get("RateLimit"), w.Body.String()
}

func (p *answerPair) answered(t *testing.T) float64 {
	t.Helper()
	return p.counter(t, "dropline_graphql_sold_out_answered_total")
}

func (p *answerPair) counter(t *testing.T, name string) float64 {
	t.Helper()
	mfs, err := p.reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatal("no " + name)
	return 0
}

// soldOutKnown reserves sku until the memory vouches that it is sold out.
func (p *answerPair) soldOutKnown(t *testing.T, authz, sku string) {
	t.Helper()
	body := reqBody(t, `mutation { reserve(input: {sku: "`+sku+`", quantity: 1}) { userErrors { code } } }`, nil, "")
	require.Eventually(t, func() bool {
		postRaw(t, p.execAll, authz, body)
		return p.e.Engine.KnownSoldOut(sku)
	}, 10*time.Second, 20*time.Millisecond)
}

func reqBody(t *testing.T, query string, vars map[string]any, op string) string {
	t.Helper()
	m := map[string]any{"query": query}
	if vars != nil {
		m["variables"] = vars
	}
	if op != "" {
		m["operationName"] = op
	}
	b, err := json.Marshal(m)
	require.NoError(t, err)
	return string(b)
}

// TestSoldOutAnswerIsTheExecutedAnswer sends requests of many shapes for a
// sold-out SKU the memory vouches for to the handler as served and to one
// executing every operation: status, RateLimit header and body are the
// same byte for byte, and the shapes that may be answered without
// execution were (and no other).
func TestSoldOutAnswerIsTheExecutedAnswer(t *testing.T) {
	p := setupAnswerPair(t, graphql.Limits{MutationBurst: 1000})
	admin := p.e.Token(t, "ops", true)
	const sku = "GONE-1"
	p.e.CreateProduct(t, map[string]any{"sku": sku, "stock": 0})
	p.e.CreateProduct(t, map[string]any{"sku": "THERE-1", "stock": 5})
	buyer := p.e.Token(t, "buyer-1", false)
	p.soldOutKnown(t, admin, sku)

	vars := map[string]any{"input": map[string]any{"sku": sku, "quantity": 1}}
	const full = `{ __typename reservation { token expiresAt status } userErrors { __typename code field message retryAfterSeconds available } }`
	cases := []struct {
		name     string
		query    string
		vars     map[string]any
		op       string
		authz    string
		answered bool
	}{
		{"the storefront's", `mutation Reserve($input: ReserveInput!) { reserve(input: $input) { reservation { token expiresAt } userErrors { code retryAfterSeconds } } }`, vars, "", buyer, true},
		{"the storefront's again, other variables", `mutation Reserve($input: ReserveInput!) { reserve(input: $input) { reservation { token expiresAt } userErrors { code retryAfterSeconds } } }`, map[string]any{"input": map[string]any{"sku": sku, "quantity": 3}}, "", buyer, true},
		{"the storefront's, another idempotent", `mutation Reserve($input: ReserveInput!) { reserve(input: $input) { reservation { token expiresAt } userErrors { code retryAfterSeconds } } }`, map[string]any{"input": map[string]any{"sku": sku, "quantity": 1, "idempotencyKey": "k-2"}}, "", buyer, false},
		{"inline input", `mutation { reserve(input: {sku: "` + sku + `", quantity: 1}) { userErrors { code message field } } }`, nil, "", buyer, true},
		{"every field", `mutation R($input: ReserveInput!) { reserve(input: $input) ` + full + ` }`, vars, "", buyer, true},
		{"aliases", `mutation($input: ReserveInput!) { r: reserve(input: $input) { res: reservation { t: token } errs: userErrors { c: code m: message f: field a: available w: retryAfterSeconds t: __typename } tn: __typename } }`, vars, "", buyer, true},
		{"an alias named like another field", `mutation($input: ReserveInput!) { reservation: reserve(input: $input) { userErrors: reservation { token } reservation: userErrors { message: code code: message } } }`, vars, "", buyer, true},
		{"an alias to escape", `mutation($input: ReserveInput!) { r\u00e9serve: reserve(input: $input) { userErrors { code } } }`, vars, "", buyer, false},
		{"fragments", `mutation($input: ReserveInput!) { reserve(input: $input) { ...P } } fragment P on ReservePayload { userErrors { ...U } reservation { token } } fragment U on UserError { code field }`, vars, "", buyer, true},
		{"inline fragments", `mutation($input: ReserveInput!) { reserve(input: $input) { ... on ReservePayload { userErrors { ... { code } message } } } }`, vars, "", buyer, true},
		{"fields merged", `mutation($input: ReserveInput!) { reserve(input: $input) { userErrors { code } userErrors { message code } __typename } }`, vars, "", buyer, true},
		{"skip and include", `mutation($input: ReserveInput!, $yes: Boolean!) { reserve(input: $input) { reservation @skip(if: true) { token } userErrors { code @include(if: $yes) message @include(if: false) field @skip(if: $yes) } } }`, map[string]any{"input": vars["input"], "yes": true}, "", buyer, true},
		{"reserve skipped", `mutation($input: ReserveInput!) { reserve(input: $input) @skip(if: true) { userErrors { code } } }`, vars, "", buyer, false},
		{"variables inside the input", `mutation($s: ID!, $q: Int!) { reserve(input: {sku: $s, quantity: $q}) { userErrors { code } } }`, map[string]any{"s": sku, "q": 2}, "", buyer, true},
		{"explicit nulls", `mutation { reserve(input: {sku: "` + sku + `", quantity: 1, idempotencyKey: null, admissionPass: null, holdSeconds: null}) { userErrors { code } } }`, nil, "", buyer, true},
		{"null variables", `mutation($input: ReserveInput!) { reserve(input: $input) { userErrors { code } } }`, map[string]any{"input": map[string]any{"sku": sku, "quantity": 1, "idempotencyKey": nil}}, "", buyer, true},
		{"one of two operations", `query Q { __typename } mutation M($input: ReserveInput!) { reserve(input: $input) { userErrors { code } } }`, vars, "M", buyer, true},
		{"the other operation", `query Q { __typename } mutation M($input: ReserveInput!) { reserve(input: $input) { userErrors { code } } }`, vars, "Q", buyer, false},
		{"the mutation's typename too", `mutation($input: ReserveInput!) { __typename reserve(input: $input) { userErrors { code } } }`, vars, "", buyer, false},
		{"two reserves", `mutation($input: ReserveInput!) { a: reserve(input: $input) { userErrors { code } } b: reserve(input: $input) { userErrors { code } } }`, vars, "", buyer, false},
		{"a reserve and another mutation", `mutation($input: ReserveInput!) { reserve(input: $input) { userErrors { code } } cancel(input: {token: "x"}) { userErrors { code } } }`, vars, "", buyer, false},
		{"an idempotency key", `mutation { reserve(input: {sku: "` + sku + `", quantity: 1, idempotencyKey: "k-1"}) { userErrors { code } } }`, nil, "", buyer, false},
		{"the same key again", `mutation { reserve(input: {sku: "` + sku + `", quantity: 1, idempotencyKey: "k-1"}) { userErrors { code } } }`, nil, "", buyer, false},
		{"a hold length", `mutation { reserve(input: {sku: "` + sku + `", quantity: 1, holdSeconds: 60}) { userErrors { code } } }`, nil, "", buyer, false},
		{"an admission pass", `mutation { reserve(input: {sku: "` + sku + `", quantity: 1, admissionPass: "p"}) { userErrors { code } } }`, nil, "", buyer, false},
		{"quantity 0", `mutation { reserve(input: {sku: "` + sku + `", quantity: 0}) { userErrors { code field } } }`, nil, "", buyer, false},
		{"negative quantity", `mutation { reserve(input: {sku: "` + sku + `", quantity: -3}) { userErrors { code field } } }`, nil, "", buyer, false},
		{"a quantity past Int", `mutation($input: ReserveInput!) { reserve(input: $input) { userErrors { code } } }`, map[string]any{"input": map[string]any{"sku": sku, "quantity": 1 << 40}}, "", buyer, false},
		{"a fractional quantity", `mutation($input: ReserveInput!) { reserve(input: $input) { userErrors { code } } }`, map[string]any{"input": map[string]any{"sku": sku, "quantity": 1.5}}, "", buyer, false},
		{"an exponent quantity", `mutation($input: ReserveInput!) { reserve(input: $input) { userErrors { code } } }`, map[string]any{"input": map[string]any{"sku": sku, "quantity": json.Number("1e0")}}, "", buyer, false},
		{"an unknown input field", `mutation($input: ReserveInput!) { reserve(input: $input) { userErrors { code } } }`, map[string]any{"input": map[string]any{"sku": sku, "quantity": 1, "nope": 1}}, "", buyer, false},
		{"a sku and no quantity", `mutation($input: ReserveInput!) { reserve(input: $input) { userErrors { code } } }`, map[string]any{"input": map[string]any{"sku": sku, "nope": 1}}, "", buyer, false},
		{"a nullable input", `mutation($input: ReserveInput) { reserve(input: $input) { userErrors { code } } }`, vars, "", buyer, false},
		{"an input with a default", `mutation($input: ReserveInput! = {sku: "X-1", quantity: 1}) { reserve(input: $input) { userErrors { code } } }`, vars, "", buyer, true},
		{"a variable of another name", `mutation($in: ReserveInput!) { reserve(input: $in) { userErrors { code } } }`, map[string]any{"in": vars["input"]}, "", buyer, true},
		{"the input's default", `mutation($input: ReserveInput! = {sku: "` + sku + `", quantity: 2}) { reserve(input: $input) { userErrors { code } } }`, nil, "", buyer, true},
		{"another variable beside", `mutation($input: ReserveInput!) { reserve(input: $input) { userErrors { code } } }`, map[string]any{"input": vars["input"], "other": 1}, "", buyer, true},
		{"a numeric sku", `mutation($input: ReserveInput!) { reserve(input: $input) { userErrors { code } } }`, map[string]any{"input": map[string]any{"sku": 7, "quantity": 1}}, "", buyer, false},
		{"an invalid sku", `mutation { reserve(input: {sku: "no spaces", quantity: 1}) { userErrors { code field } } }`, nil, "", buyer, false},
		{"an unknown sku", `mutation { reserve(input: {sku: "NOPE-1", quantity: 1}) { userErrors { code field } } }`, nil, "", buyer, false},
		{"anonymous", `mutation($input: ReserveInput!) { reserve(input: $input) { userErrors { code message } } }`, vars, "", "", false},
		{"a query", `query { product(sku: "` + sku + `") { sku } }`, nil, "", buyer, false},
		{"invalid document", `mutation($input: ReserveInput!) { reserve(input: $input) { userErrors { nope } } }`, vars, "", buyer, false},
		{"a missing variable", `mutation($input: ReserveInput!) { reserve(input: $input) { userErrors { code } } }`, nil, "", buyer, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			body := reqBody(t, c.query, c.vars, c.op)
			// The memory must vouch for the SKU for the comparison to
			// prove anything: it is re-read every 200 ms.
			require.True(t, p.e.Engine.KnownSoldOut(sku))
			before := p.answered(t)
			code, limit, got := postRaw(t, p.served, c.authz, body)
			answered := p.answered(t) - before
			wantCode, wantLimit, want := postRaw(t, p.execAll, c.authz, body)
			require.Equal(t, want, got)
			require.Equal(t, wantCode, code)
			require.Equal(t, wantLimit, limit)
			if c.answered {
				require.Equal(t, 1.0, answered, "answered without execution: %s", got)
				require.Contains(t, got, "OUT_OF_STOCK")
			} else {
				require.Zero(t, answered, "answered without execution: %s", got)
			}
		})
	}
	// A SKU with units is never answered from the memory.
	code, _, got := postRaw(t, p.served, buyer, reqBody(t, `mutation { reserve(input: {sku: "THERE-1", quantity: 1}) { reservation { quantity } userErrors { code } } }`, nil, ""))
	require.Equal(t, http.StatusOK, code)
	require.JSONEq(t, `{"reserve":{"reservation":{"quantity":1},"userErrors":[]}}`, dataOf(t, got))
}

func dataOf(t *testing.T, body string) string {
	t.Helper()
	var r struct {
		Data json.RawMessage `json:"data"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &r))
	return string(r.Data)
}

// TestSoldOutAnswerRateLimited: a buyer past its mutation budget asking for
// a SKU the memory vouches for is answered RATE_LIMITED without execution,
// as the executed operation answers another buyer in the same state.
func TestSoldOutAnswerRateLimited(t *testing.T) {
	p := setupAnswerPair(t, graphql.Limits{MutationRate: 1, MutationPeriod: time.Minute, MutationBurst: 2})
	const sku = "GONE-2"
	p.e.CreateProduct(t, map[string]any{"sku": sku, "stock": 0})
	p.soldOutKnown(t, p.e.Token(t, "ops", true), sku)
	served, execAll := p.e.Token(t, "buyer-a", false), p.e.Token(t, "buyer-b", false)
	body := reqBody(t, `mutation($input: ReserveInput!) { reserve(input: $input) { userErrors { code message field retryAfterSeconds available } } }`,
		map[string]any{"input": map[string]any{"sku": sku, "quantity": 1}}, "")
	limited := 0
	for i := range 5 {
		require.True(t, p.e.Engine.KnownSoldOut(sku))
		before := p.answered(t)
		code, limit, got := postRaw(t, p.served, served, body)
		require.Equal(t, 1.0, p.answered(t)-before, "request %d answered without execution: %s", i, got)
		wantCode, wantLimit, want := postRaw(t, p.execAll, execAll, body)
		require.Equal(t, want, got)
		require.Equal(t, wantCode, code)
		require.Equal(t, wantLimit, limit)
		if strings.Contains(got, "RATE_LIMITED") {
			limited++
		}
	}
	require.Equal(t, 3, limited, "a burst of 2, then one a minute")
}

// TestSoldOutAnswerWaitsAtTheGate: a refusal answered without execution
// takes a slot of the gate as an executed reserve does, so with every slot
// held it waits and is answered SERVER_BUSY as the executed one is; once
// a slot is free it is answered.
func TestSoldOutAnswerWaitsAtTheGate(t *testing.T) {
	p := setupAnswerPair(t, graphql.Limits{MutationBurst: 1000})
	const sku = "GONE-3"
	p.e.CreateProduct(t, map[string]any{"sku": sku, "stock": 0})
	p.soldOutKnown(t, p.e.Token(t, "ops", true), sku)
	gs, ge := graphql.NewTestGate(1, 300*time.Millisecond, prometheus.NewRegistry()), graphql.NewTestGate(1, 300*time.Millisecond, prometheus.NewRegistry())
	served, execAll := p.cfg, p.cfg
	served.Registerer, execAll.Registerer = p.reg, prometheus.NewRegistry()
	hs, he := graphql.NewHandlerGated(served, gs), graphql.NewHandlerGatedExecutingAll(execAll, ge)
	buyer := p.e.Token(t, "buyer-1", false)
	body := reqBody(t, `mutation($input: ReserveInput!) { reserve(input: $input) { userErrors { code } } }`,
		map[string]any{"input": map[string]any{"sku": sku, "quantity": 1}}, "")

	gs.Hold()
	ge.Hold()
	began := time.Now()
	code, limit, got := postRaw(t, hs, buyer, body)
	require.GreaterOrEqual(t, time.Since(began), 300*time.Millisecond)
	wantCode, wantLimit, want := postRaw(t, he, buyer, body)
	require.Contains(t, got, graphql.CodeBusy)
	require.Equal(t, want, got)
	require.Equal(t, wantCode, code)
	require.Equal(t, wantLimit, limit)

	gs.Release()
	ge.Release()
	require.True(t, p.e.Engine.KnownSoldOut(sku))
	before := p.answered(t)
	code, limit, got = postRaw(t, hs, buyer, body)
	require.Equal(t, 1.0, p.answered(t)-before)
	wantCode, wantLimit, want = postRaw(t, he, buyer, body)
	require.Contains(t, got, "OUT_OF_STOCK")
	require.Equal(t, want, got)
	require.Equal(t, wantCode, code)
	require.Equal(t, wantLimit, limit)
}

// heldValues are what differs between two holds made alike: the token, the
// global id made of it, and the times.
var heldValues = []struct {
	re   *regexp.Regexp
	with string
}{
	{regexp.MustCompile(`"UmVzZXJ2YXRpb246[A-Za-z0-9+/=]+"`), `"<id>"`},
	{regexp.MustCompile(`"[A-Za-z][0-9]{2}\.[A-Za-z0-9_-]+"`), `"<token>"`},
	{regexp.MustCompile(`"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:.]+(Z|[+-][0-9]{2}:[0-9]{2})"`), `"<time>"`},
}

func withoutHeldValues(body string) string {
	for _, v := range heldValues {
		body = v.re.ReplaceAllString(body, v.with)
	}
	return body
}

// TestReserveAnswerIsTheExecutedAnswer sends reserves of many shapes for a
// SKU with units to the handler as served and to one executing every
// operation: status, RateLimit header and body are the same byte for byte
// but for the hold's own token, id and times, and the shapes that may be
// answered by calling the resolver in the transport were (and no other).
func TestReserveAnswerIsTheExecutedAnswer(t *testing.T) {
	p := setupAnswerPair(t, graphql.Limits{MutationBurst: 1000})
	const sku = "MANY-1"
	p.e.CreateProduct(t, map[string]any{"sku": sku, "stock": 1000})
	p.e.CreateProduct(t, map[string]any{"sku": "FEW-1", "stock": 2})
	buyer := p.e.Token(t, "buyer-1", false)

	vars := map[string]any{"input": map[string]any{"sku": sku, "quantity": 1}}
	const storefront = `mutation Reserve($input: ReserveInput!) { reserve(input: $input) { reservation { token expiresAt } userErrors { code retryAfterSeconds } } }`
	const every = `{ __typename reservation { __typename id token sku quantity status expiresAt createdAt committedAt extensions } userErrors { __typename code field message retryAfterSeconds available } }`
	cases := []struct {
		name     string
		query    string
		vars     map[string]any
		authz    string
		answered bool
	}{
		{"the storefront's", storefront, vars, buyer, true},
		{"every field", `mutation R($input: ReserveInput!) { reserve(input: $input) ` + every + ` }`, vars, buyer, true},
		{"aliases and fragments", `mutation($input: ReserveInput!) { r: reserve(input: $input) { h: reservation { ... on Node { i: id } ...F q: quantity } } } fragment F on Reservation { t: token s: status token }`, vars, buyer, true},
		{"skip and include", `mutation($input: ReserveInput!, $yes: Boolean!) { reserve(input: $input) { reservation { token @include(if: $yes) sku @skip(if: $yes) } } }`, map[string]any{"input": vars["input"], "yes": true}, buyer, true},
		{"no reservation asked for", `mutation($input: ReserveInput!) { reserve(input: $input) { userErrors { code } } }`, vars, buyer, true},
		{"more than there is", `mutation($input: ReserveInput!) { reserve(input: $input) ` + every + ` }`, map[string]any{"input": map[string]any{"sku": "FEW-1", "quantity": 5}}, buyer, true},
		{"negative quantity", `mutation { reserve(input: {sku: "` + sku + `", quantity: -3}) ` + every + ` }`, nil, buyer, true},
		{"an unknown sku", `mutation { reserve(input: {sku: "NOPE-1", quantity: 1}) ` + every + ` }`, nil, buyer, true},
		{"an invalid sku", `mutation { reserve(input: {sku: "no spaces", quantity: 1}) ` + every + ` }`, nil, buyer, true},
		{"anonymous", `mutation($input: ReserveInput!) { reserve(input: $input) ` + every + ` }`, vars, "", true},
		{"the product", `mutation($input: ReserveInput!) { reserve(input: $input) { reservation { token product { sku } } } }`, vars, buyer, false},
		{"an idempotency key", `mutation { reserve(input: {sku: "` + sku + `", quantity: 1, idempotencyKey: "k-1"}) { reservation { token } } }`, nil, buyer, true},
		{"a hold length", `mutation { reserve(input: {sku: "` + sku + `", quantity: 1, holdSeconds: 60}) { reservation { token } } }`, nil, buyer, true},
		{"a key and a hold length as variables", `mutation Reserve($input: ReserveInput!) { reserve(input: $input) { reservation { token status quantity expiresAt } userErrors { code field message retryAfterSeconds } } }`,
			map[string]any{"input": map[string]any{"sku": sku, "quantity": 1, "idempotencyKey": "k-2", "holdSeconds": 120}}, buyer, true},
		{"a null key", storefront, map[string]any{"input": map[string]any{"sku": sku, "quantity": 1, "idempotencyKey": nil}}, buyer, true},
		{"a hold too long", `mutation { reserve(input: {sku: "` + sku + `", quantity: 1, holdSeconds: 99999}) ` + every + ` }`, nil, buyer, true},
		{"a hold length past Int", storefront, map[string]any{"input": map[string]any{"sku": sku, "quantity": 1, "holdSeconds": 1 << 40}}, buyer, false},
		{"a numeric key", storefront, map[string]any{"input": map[string]any{"sku": sku, "quantity": 1, "idempotencyKey": 7}}, buyer, false},
		{"an admission pass", `mutation { reserve(input: {sku: "` + sku + `", quantity: 1, admissionPass: "p-1"}) { reservation { token } userErrors { code } } }`, nil, buyer, false},
		{"two reserves", `mutation($input: ReserveInput!) { a: reserve(input: $input) { reservation { token } } b: reserve(input: $input) { reservation { token } } }`, vars, buyer, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			body := reqBody(t, c.query, c.vars, "")
			before := p.counter(t, "dropline_graphql_reserve_answered_total")
			code, limit, got := postRaw(t, p.served, c.authz, body)
			answered := p.counter(t, "dropline_graphql_reserve_answered_total") - before
			wantCode, wantLimit, want := postRaw(t, p.execAll, c.authz, body)
			require.Equal(t, withoutHeldValues(want), withoutHeldValues(got))
			require.Equal(t, wantCode, code)
			require.Equal(t, wantLimit, limit)
			if c.answered {
				require.Equal(t, 1.0, answered, "answered in the transport: %s", got)
			} else {
				require.Zero(t, answered, "answered in the transport: %s", got)
			}
		})
	}
	// The holds were made: each handler's run of the eleven requests that
	// hold a unit of the SKU (two for two reserves), but for the three
	// with a key (a numeric one is coerced to its String), whose second
	// run replays the first.
	require.Eventually(t, func() bool {
		_, _, got := postRaw(t, p.execAll, buyer, reqBody(t, `{ product(sku: "`+sku+`") { stock { available } } }`, nil, ""))
		return strings.Contains(got, `"available":`+strconv.Itoa(1000-25))
	}, 5*time.Second, 50*time.Millisecond)
}
