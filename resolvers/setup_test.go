package resolvers_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/99designs/gqlgen/client"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/auth"
	"github.com/dropline/dropline/internal/testenv"
	"github.com/dropline/dropline/inventory"
	"github.com/dropline/dropline/server"
	"github.com/dropline/dropline/server/graphql"
)

func TestMain(m *testing.M) { testenv.Main(m) }

var secret = []byte(strings.Repeat("s", 32))

// env is one test's API: its own database, key prefix, handler and logs.
type env struct {
	engine  *inventory.Engine
	rdb     redis.UniversalClient
	prefix  string
	issuer  *auth.Issuer
	handler http.Handler
	client  *client.Client
	logs    *syncBuffer
	hmget   *atomic.Int64 // pipelines that read stock (HMGET)
	pool    interface{ Close() }
}

func setup(t *testing.T, mods ...func(*graphql.Config)) *env {
	t.Helper()
	pool := testenv.Postgres(t)
	r := testenv.Redis(t)
	counter := &atomic.Int64{}
	r.Client.AddHook(stockReadCounter{n: counter})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	eng, err := inventory.NewEngine(ctx, inventory.Config{KeyPrefix: r.Prefix}, r.Client, pool, zerolog.Nop())
	require.NoError(t, err)
	iss, err := auth.NewIssuer(secret)
	require.NoError(t, err)
	logs := &syncBuffer{}
	cfg := graphql.Config{
		Engine: eng, Redis: r.Client, Verifier: iss,
		CORSOrigins: []string{"https://shop.example"},
		Limits:      graphql.Limits{MutationBurst: 1000},
	}
	for _, m := range mods {
		m(&cfg)
	}
	h := server.RequestID(zerolog.New(logs), graphql.NewHandler(cfg))
	return &env{engine: eng, rdb: r.Client, prefix: r.Prefix, issuer: iss, handler: h,
		client: client.New(h), logs: logs, hmget: counter, pool: pool}
}

// token mints a bearer header value for principal.
func (e *env) token(t *testing.T, principal string, admin bool) string {
	t.Helper()
	tok, err := e.issuer.Mint(principal, admin, time.Hour)
	require.NoError(t, err)
	return "Bearer " + tok
}

type gqlError struct {
	Message    string         `json:"message"`
	Path       []any          `json:"path"`
	Extensions map[string]any `json:"extensions"`
}

func (g gqlError) code() string { s, _ := g.Extensions["code"].(string); return s }

// do runs one operation in process (gqlgen's client) as authz ("" for
// anonymous), decodes data into out and returns the top-level errors.
func (e *env) do(t *testing.T, authz, query string, vars map[string]any, out any) []gqlError {
	t.Helper()
	opts := []client.Option{}
	if authz != "" {
		opts = append(opts, client.AddHeader("Authorization", authz))
	}
	for k, v := range vars {
		opts = append(opts, client.Var(k, v))
	}
	resp, err := e.client.RawPost(query, opts...)
	require.NoError(t, err)
	if out != nil && resp.Data != nil {
		b, err := json.Marshal(resp.Data)
		require.NoError(t, err)
		require.NoError(t, json.Unmarshal(b, out))
	}
	var errs []gqlError
	if len(resp.Errors) > 0 {
		require.NoError(t, json.Unmarshal(resp.Errors, &errs))
	}
	return errs
}

// mustDo is do that fails the test on any top-level error.
func (e *env) mustDo(t *testing.T, authz, query string, vars map[string]any, out any) {
	t.Helper()
	errs := e.do(t, authz, query, vars, out)
	require.Empty(t, errs, "unexpected errors")
}

// stockReadCounter counts the Redis round trips that read stock, to prove
// a page of products costs one.
type stockReadCounter struct{ n *atomic.Int64 }

func (stockReadCounter) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (stockReadCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (c stockReadCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			if cmd.Name() == "hmget" {
				c.n.Add(1)
				break
			}
		}
		return next(ctx, cmds)
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func b64(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

// Shared documents.

type userError struct {
	Code              string   `json:"code"`
	Field             []string `json:"field"`
	Message           string   `json:"message"`
	RetryAfterSeconds *int     `json:"retryAfterSeconds"`
}

type stock struct {
	ID        string    `json:"id"`
	Sku       string    `json:"sku"`
	Available int       `json:"available"`
	Held      int       `json:"held"`
	Sold      int       `json:"sold"`
	Total     int       `json:"total"`
	UpdatedAt time.Time `json:"updatedAt"`
}

type product struct {
	ID    string `json:"id"`
	Sku   string `json:"sku"`
	Name  string `json:"name"`
	Price struct {
		Amount   int
		Currency string
	} `json:"price"`
	MaxPerUser   *int       `json:"maxPerUser"`
	SaleStartsAt *time.Time `json:"saleStartsAt"`
	SaleEndsAt   *time.Time `json:"saleEndsAt"`
	Stock        stock      `json:"stock"`
}

type reservation struct {
	ID          string     `json:"id"`
	Token       string     `json:"token"`
	Sku         string     `json:"sku"`
	Quantity    int        `json:"quantity"`
	Status      string     `json:"status"`
	ExpiresAt   time.Time  `json:"expiresAt"`
	CreatedAt   time.Time  `json:"createdAt"`
	CommittedAt *time.Time `json:"committedAt"`
	Product     product    `json:"product"`
}

type payload struct {
	Reservation *reservation `json:"reservation"`
	Product     *product     `json:"product"`
	UserErrors  []userError  `json:"userErrors"`
}

const (
	stockFields       = `id sku available held sold total updatedAt`
	productFields     = `id sku name price { amount currency } maxPerUser saleStartsAt saleEndsAt stock { ` + stockFields + ` }`
	reservationFields = `id token sku quantity status expiresAt createdAt committedAt product { ` + productFields + ` }`
	userErrorFields   = `userErrors { code field message retryAfterSeconds }`

	reserveDoc = `mutation($i: ReserveInput!) { reserve(input: $i) { reservation { ` + reservationFields + ` } ` + userErrorFields + ` } }`
	commitDoc  = `mutation($i: CommitInput!) { commit(input: $i) { reservation { ` + reservationFields + ` } ` + userErrorFields + ` } }`
	cancelDoc  = `mutation($i: CancelInput!) { cancel(input: $i) { reservation { ` + reservationFields + ` } ` + userErrorFields + ` } }`
	createDoc  = `mutation($i: CreateProductInput!) { createProduct(input: $i) { product { ` + productFields + ` } ` + userErrorFields + ` } }`
	updateDoc  = `mutation($i: UpdateProductInput!) { updateProduct(input: $i) { product { ` + productFields + ` } ` + userErrorFields + ` } }`
	restockDoc = `mutation($i: RestockInput!) { restock(input: $i) { product { ` + productFields + ` } ` + userErrorFields + ` } }`
)

func (e *env) reserve(t *testing.T, authz string, in map[string]any) payload {
	t.Helper()
	var out struct{ Reserve payload }
	e.mustDo(t, authz, reserveDoc, map[string]any{"i": in}, &out)
	return out.Reserve
}

func (e *env) commit(t *testing.T, authz, token string) payload {
	t.Helper()
	var out struct{ Commit payload }
	e.mustDo(t, authz, commitDoc, map[string]any{"i": map[string]any{"token": token}}, &out)
	return out.Commit
}

func (e *env) cancel(t *testing.T, authz, token string) payload {
	t.Helper()
	var out struct{ Cancel payload }
	e.mustDo(t, authz, cancelDoc, map[string]any{"i": map[string]any{"token": token}}, &out)
	return out.Cancel
}

// createProduct makes a product as an admin and fails the test otherwise.
func (e *env) createProduct(t *testing.T, in map[string]any) product {
	t.Helper()
	if _, ok := in["price"]; !ok {
		in["price"] = map[string]any{"amount": 1999, "currency": "EUR"}
	}
	if _, ok := in["name"]; !ok {
		in["name"] = "Sneaker " + in["sku"].(string)
	}
	var out struct{ CreateProduct payload }
	e.mustDo(t, e.token(t, "admin", true), createDoc, map[string]any{"i": in}, &out)
	require.Empty(t, out.CreateProduct.UserErrors)
	require.NotNil(t, out.CreateProduct.Product)
	return *out.CreateProduct.Product
}

// only asserts that p failed with exactly one userError of code.
func only(t *testing.T, p payload, code string) userError {
	t.Helper()
	require.Nil(t, p.Reservation)
	require.Nil(t, p.Product)
	require.Len(t, p.UserErrors, 1, "userErrors: %+v", p.UserErrors)
	require.Equal(t, code, p.UserErrors[0].Code, p.UserErrors[0].Message)
	return p.UserErrors[0]
}
