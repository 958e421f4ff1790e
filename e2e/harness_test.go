package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/app"
	"github.com/dropline/dropline/auth"
	"github.com/dropline/dropline/config"
	"github.com/dropline/dropline/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

const testSecret = "e2e-test-secret-e2e-test-secret-e2e"

// system is one running Dropline with its own database and key prefix.
type system struct {
	URL    string
	Issuer *auth.Issuer
	Pool   *pgxpool.Pool
	Config config.Config
	app    *app.App
}

// start runs the real App, wired as `dropline serve` wires it, on a free port.
func start(t *testing.T) *system {
	t.Helper()
	redisEnv := testenv.Redis(t) // for the prefix and its clean-up
	cfg := config.Default()
	cfg.Addr = "127.0.0.1:0"
	cfg.DatabaseURL = testenv.NewDatabase(t)
	cfg.KeyPrefix = redisEnv.Prefix
	cfg.JWTSecret = testSecret
	cfg.ShutdownTimeout = 10 * time.Second
	require.NoError(t, cfg.Validate())

	a := app.New(cfg, zerolog.Nop())
	ctx := context.Background()
	require.NoError(t, a.Start(ctx))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		require.NoError(t, a.Stop(ctx))
	})
	pool, err := pgxpool.New(ctx, cfg.DatabaseURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return &system{URL: "http://" + a.Addr(), Issuer: a.Issuer(), Pool: pool, Config: cfg, app: a}
}

func (s *system) token(t *testing.T, user string, admin bool) string {
	t.Helper()
	tok, err := s.Issuer.Mint(user, admin, time.Hour)
	require.NoError(t, err)
	return tok
}

// gqlResponse is a GraphQL response with the data left for the caller to decode.
type gqlResponse struct {
	Data   json.RawMessage `json:"data"`
	Errors []struct {
		Message    string         `json:"message"`
		Extensions map[string]any `json:"extensions"`
	} `json:"errors"`
}

// gql posts one operation and decodes data into out (when non-nil).
func (s *system) gql(t testing.TB, client *http.Client, token, query string, vars map[string]any, out any) gqlResponse {
	t.Helper()
	r, err := s.tryGQL(client, token, query, vars, out)
	require.NoError(t, err)
	return r
}

// tryGQL is gql for goroutines other than the test's: it returns what went
// wrong instead of failing the test.
func (s *system) tryGQL(client *http.Client, token, query string, vars map[string]any, out any) (gqlResponse, error) {
	body, err := json.Marshal(map[string]any{"query": query, "variables": vars})
	if err != nil {
		return gqlResponse{}, err
	}
	req, err := http.NewRequest(http.MethodPost, s.URL+"/graphql", bytes.NewReader(body))
	if err != nil {
		return gqlResponse{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := client.Do(req)
	if err != nil {
		return gqlResponse{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return gqlResponse{}, fmt.Errorf("HTTP status %d", resp.StatusCode)
	}
	var r gqlResponse
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		return gqlResponse{}, err
	}
	if out != nil && len(r.Data) > 0 {
		if err := json.Unmarshal(r.Data, out); err != nil {
			return r, fmt.Errorf("data %s: %w", r.Data, err)
		}
	}
	return r, nil
}

type userError struct {
	Code    string   `json:"code"`
	Field   []string `json:"field"`
	Message string   `json:"message"`
}

type reservation struct {
	Token     string `json:"token"`
	Status    string `json:"status"`
	Quantity  int    `json:"quantity"`
	ExpiresAt string `json:"expiresAt"`
}

type stock struct {
	Available int `json:"available"`
	Held      int `json:"held"`
	Sold      int `json:"sold"`
	Total     int `json:"total"`
}

func (s *system) createProduct(t *testing.T, sku string, units, maxPerUser int) {
	t.Helper()
	var out struct {
		CreateProduct struct {
			UserErrors []userError `json:"userErrors"`
		} `json:"createProduct"`
	}
	input := map[string]any{"sku": sku, "name": "E2E " + sku, "price": map[string]any{"amount": 4200, "currency": "EUR"}, "stock": units}
	if maxPerUser > 0 {
		input["maxPerUser"] = maxPerUser
	}
	r := s.gql(t, http.DefaultClient, s.token(t, "ops", true),
		`mutation($input: CreateProductInput!) { createProduct(input: $input) { userErrors { code message } } }`,
		map[string]any{"input": input}, &out)
	require.Empty(t, r.Errors)
	require.Empty(t, out.CreateProduct.UserErrors)
}

func (s *system) stock(t *testing.T, sku string) stock {
	t.Helper()
	var out struct {
		Product struct {
			Stock stock `json:"stock"`
		} `json:"product"`
	}
	r := s.gql(t, http.DefaultClient, "", `query($sku: ID!) { product(sku: $sku) { stock { available held sold total } } }`,
		map[string]any{"sku": sku}, &out)
	require.Empty(t, r.Errors)
	return out.Product.Stock
}

func (s *system) scalar(t *testing.T, query string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, s.Pool.QueryRow(context.Background(), query, args...).Scan(&n), query)
	return n
}

func buyerName(i int) string { return fmt.Sprintf("buyer-%04d", i) }
