// Package graphqltest runs the /graphql handler in process over real Redis
// and real PostgreSQL for the tests of the packages that serve it (resolvers,
// server/graphql): each test gets its own database, key prefix, handler and
// log buffer, and a few typed helpers for the documents the tests share.
package graphqltest

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/99designs/gqlgen/client"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/auth"
	"github.com/dropline/dropline/internal/testenv"
	"github.com/dropline/dropline/inventory"
	"github.com/dropline/dropline/server"
	"github.com/dropline/dropline/server/graphql"
)

// Secret signs the tests' bearer tokens.
var Secret = []byte(strings.Repeat("s", 32))

// Env is one test's API: its own database, key prefix, handler and logs.
type Env struct {
	Engine  *inventory.Engine
	Redis   redis.UniversalClient
	Prefix  string
	Issuer  *auth.Issuer
	Handler http.Handler
	Client  *client.Client
	Logs    *testenv.LogBuffer
	Pool    *pgxpool.Pool
	// StockReads counts the Redis pipelines that read stock (HMGET), to
	// prove that a page of products costs one round trip.
	StockReads *atomic.Int64
}

// Setup builds the handler the server mounts at /graphql, with the server's
// request-id middleware in front, on a fresh database and key prefix. mods
// change its configuration before it is built.
func Setup(t testing.TB, mods ...func(*graphql.Config)) *Env {
	t.Helper()
	return SetupOn(t, "single", mods...)
}

// SetupOn is Setup on one of testenv.Backends: "single" or "cluster" (the
// three-master Redis Cluster the test binary starts).
func SetupOn(t testing.TB, backend string, mods ...func(*graphql.Config)) *Env {
	t.Helper()
	pool := testenv.Postgres(t)
	r := testenv.RedisBackend(t, backend)
	counter := &atomic.Int64{}
	r.Client.AddHook(stockReadCounter{n: counter})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	eng, err := inventory.NewEngine(ctx, inventory.Config{KeyPrefix: r.Prefix}, r.Client, pool, zerolog.Nop())
	require.NoError(t, err)
	iss, err := auth.NewIssuer(Secret)
	require.NoError(t, err)
	logs := &testenv.LogBuffer{}
	cfg := graphql.Config{
		Engine: eng, Redis: r.Client, Verifier: iss,
		CORSOrigins: []string{"https://shop.example"},
		Limits:      graphql.Limits{MutationBurst: 1000},
	}
	for _, m := range mods {
		m(&cfg)
	}
	h := server.RequestID(zerolog.New(logs), graphql.NewHandler(cfg))
	return &Env{Engine: eng, Redis: r.Client, Prefix: r.Prefix, Issuer: iss, Handler: h,
		Client: client.New(h), Logs: logs, Pool: pool, StockReads: counter}
}

// Token mints a bearer header value for principal.
func (e *Env) Token(t testing.TB, principal string, admin bool) string {
	t.Helper()
	tok, err := e.Issuer.Mint(principal, admin, time.Hour)
	require.NoError(t, err)
	return "Bearer " + tok
}

// Truth reads the stock the engine reports for sku.
func (e *Env) Truth(t testing.TB, sku string) inventory.Stock {
	t.Helper()
	s, err := e.Engine.Catalog().Stock(context.Background(), sku)
	require.NoError(t, err)
	return s
}

// GQLError is one top-level GraphQL error.
type GQLError struct {
	Message    string         `json:"message"`
	Path       []any          `json:"path"`
	Extensions map[string]any `json:"extensions"`
}

// Code is the error's extensions.code.
func (g GQLError) Code() string { s, _ := g.Extensions["code"].(string); return s }

// Do runs one operation in process (gqlgen's client) as authz ("" for
// anonymous), decodes data into out and returns the top-level errors.
func (e *Env) Do(t testing.TB, authz, query string, vars map[string]any, out any) []GQLError {
	t.Helper()
	opts := []client.Option{}
	if authz != "" {
		opts = append(opts, client.AddHeader("Authorization", authz))
	}
	for k, v := range vars {
		opts = append(opts, client.Var(k, v))
	}
	resp, err := e.Client.RawPost(query, opts...)
	require.NoError(t, err)
	if out != nil && resp.Data != nil {
		b, err := json.Marshal(resp.Data)
		require.NoError(t, err)
		require.NoError(t, json.Unmarshal(b, out))
	}
	var errs []GQLError
	if len(resp.Errors) > 0 {
		require.NoError(t, json.Unmarshal(resp.Errors, &errs))
	}
	return errs
}

// MustDo is Do that fails the test on any top-level error.
func (e *Env) MustDo(t testing.TB, authz, query string, vars map[string]any, out any) {
	t.Helper()
	errs := e.Do(t, authz, query, vars, out)
	require.Empty(t, errs, "unexpected errors")
}

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

// B64 is standard base64, the encoding of global ids.
func B64(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

// UserError is a payload's userErrors entry.
type UserError struct {
	Code              string   `json:"code"`
	Field             []string `json:"field"`
	Message           string   `json:"message"`
	RetryAfterSeconds *int     `json:"retryAfterSeconds"`
}

// Stock is the Stock type as StockFields selects it.
type Stock struct {
	ID        string    `json:"id"`
	Sku       string    `json:"sku"`
	Available int       `json:"available"`
	Held      int       `json:"held"`
	Sold      int       `json:"sold"`
	Total     int       `json:"total"`
	UpdatedAt time.Time `json:"updatedAt"`
}

// Product is the Product type as ProductFields selects it.
type Product struct {
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
	Stock        Stock      `json:"stock"`
}

// Reservation is the Reservation type as ReservationFields selects it.
type Reservation struct {
	ID          string     `json:"id"`
	Token       string     `json:"token"`
	Sku         string     `json:"sku"`
	Quantity    int        `json:"quantity"`
	Status      string     `json:"status"`
	ExpiresAt   time.Time  `json:"expiresAt"`
	CreatedAt   time.Time  `json:"createdAt"`
	CommittedAt *time.Time `json:"committedAt"`
	Extensions  int        `json:"extensions"`
	Product     Product    `json:"product"`
}

// Payload is a mutation payload.
type Payload struct {
	Reservation *Reservation `json:"reservation"`
	Product     *Product     `json:"product"`
	UserErrors  []UserError  `json:"userErrors"`
}

// Shared selections and documents.
const (
	StockFields       = `id sku available held sold total updatedAt`
	ProductFields     = `id sku name price { amount currency } maxPerUser saleStartsAt saleEndsAt stock { ` + StockFields + ` }`
	ReservationFields = `id token sku quantity status expiresAt createdAt committedAt extensions product { ` + ProductFields + ` }`
	UserErrorFields   = `userErrors { code field message retryAfterSeconds }`

	ReserveDoc = `mutation($i: ReserveInput!) { reserve(input: $i) { reservation { ` + ReservationFields + ` } ` + UserErrorFields + ` } }`
	CommitDoc  = `mutation($i: CommitInput!) { commit(input: $i) { reservation { ` + ReservationFields + ` } ` + UserErrorFields + ` } }`
	CancelDoc  = `mutation($i: CancelInput!) { cancel(input: $i) { reservation { ` + ReservationFields + ` } ` + UserErrorFields + ` } }`
	ExtendDoc  = `mutation($i: ExtendReservationInput!) { extendReservation(input: $i) { reservation { ` + ReservationFields + ` } ` + UserErrorFields + ` } }`
	CreateDoc  = `mutation($i: CreateProductInput!) { createProduct(input: $i) { product { ` + ProductFields + ` } ` + UserErrorFields + ` } }`
	UpdateDoc  = `mutation($i: UpdateProductInput!) { updateProduct(input: $i) { product { ` + ProductFields + ` } ` + UserErrorFields + ` } }`
	RestockDoc = `mutation($i: RestockInput!) { restock(input: $i) { product { ` + ProductFields + ` } ` + UserErrorFields + ` } }`
)

// Reserve runs reserve as authz and returns its payload.
func (e *Env) Reserve(t testing.TB, authz string, in map[string]any) Payload {
	t.Helper()
	var out struct{ Reserve Payload }
	e.MustDo(t, authz, ReserveDoc, map[string]any{"i": in}, &out)
	return out.Reserve
}

// Commit runs commit as authz and returns its payload.
func (e *Env) Commit(t testing.TB, authz, token string) Payload {
	t.Helper()
	var out struct{ Commit Payload }
	e.MustDo(t, authz, CommitDoc, map[string]any{"i": map[string]any{"token": token}}, &out)
	return out.Commit
}

// Cancel runs cancel as authz and returns its payload.
func (e *Env) Cancel(t testing.TB, authz, token string) Payload {
	t.Helper()
	var out struct{ Cancel Payload }
	e.MustDo(t, authz, CancelDoc, map[string]any{"i": map[string]any{"token": token}}, &out)
	return out.Cancel
}

// Extend runs extendReservation as authz and returns its payload.
func (e *Env) Extend(t testing.TB, authz, token string, holdSeconds int) Payload {
	t.Helper()
	var out struct{ ExtendReservation Payload }
	e.MustDo(t, authz, ExtendDoc, map[string]any{"i": map[string]any{"token": token, "holdSeconds": holdSeconds}}, &out)
	return out.ExtendReservation
}

// CreateProduct makes a product as an admin and fails the test otherwise.
func (e *Env) CreateProduct(t testing.TB, in map[string]any) Product {
	t.Helper()
	if _, ok := in["price"]; !ok {
		in["price"] = map[string]any{"amount": 1999, "currency": "EUR"}
	}
	if _, ok := in["name"]; !ok {
		in["name"] = "Sneaker " + in["sku"].(string)
	}
	var out struct{ CreateProduct Payload }
	e.MustDo(t, e.Token(t, "admin", true), CreateDoc, map[string]any{"i": in}, &out)
	require.Empty(t, out.CreateProduct.UserErrors)
	require.NotNil(t, out.CreateProduct.Product)
	return *out.CreateProduct.Product
}

// Only asserts that p failed with exactly one userError of code.
func Only(t testing.TB, p Payload, code string) UserError {
	t.Helper()
	require.Nil(t, p.Reservation)
	require.Nil(t, p.Product)
	require.Len(t, p.UserErrors, 1, "userErrors: %+v", p.UserErrors)
	require.Equal(t, code, p.UserErrors[0].Code, p.UserErrors[0].Message)
	return p.UserErrors[0]
}
