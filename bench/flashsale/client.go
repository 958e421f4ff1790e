package flashsale

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"
)

// Outcome codes the driver records besides the schema's ErrorCode values.
// A reply that carried a userError is recorded under that error's code.
const (
	CodeOK        = "OK"
	CodeTimeout   = "TIMEOUT"   // no answer within the per-request timeout
	CodeTransport = "TRANSPORT" // connection refused, reset, ...
	CodeBadReply  = "BAD_REPLY" // not a GraphQL answer (wrong content, empty data)
)

// CallError is a request that produced no business outcome. Code is what
// the driver records for it: TIMEOUT, TRANSPORT, HTTP_<status>, BAD_REPLY or
// GRAPHQL_<extensions.code> for a top-level GraphQL error.
type CallError struct {
	Code string
	Err  error
}

func (e *CallError) Error() string { return e.Code + ": " + e.Err.Error() }
func (e *CallError) Unwrap() error { return e.Err }

// UserError is a business outcome of a mutation (schema type UserError).
type UserError struct {
	Code              string   `json:"code"`
	Field             []string `json:"field"`
	Message           string   `json:"message"`
	RetryAfterSeconds *int     `json:"retryAfterSeconds"`
}

// Reservation is the part of a reservation the driver reads back.
type Reservation struct {
	Token     string    `json:"token"`
	Status    string    `json:"status"`
	Quantity  int       `json:"quantity"`
	ExpiresAt time.Time `json:"expiresAt"`
}

// Stock is a SKU's live counters as the API reports them.
type Stock struct {
	Available int `json:"available"`
	Held      int `json:"held"`
	Sold      int `json:"sold"`
	Total     int `json:"total"`
}

// Client speaks GraphQL over HTTP to one Dropline endpoint the way a
// frontend does: a JSON POST per operation with a bearer token. It is safe
// for concurrent use.
type Client struct {
	// Endpoint is the full /graphql URL.
	Endpoint string
	// HTTP carries the requests; its Transport should keep enough idle
	// connections for the driver's concurrency.
	HTTP *http.Client
	// Timeout bounds one request; a request that exceeds it is a TIMEOUT.
	Timeout time.Duration
}

// NewClient returns a Client for endpoint with a transport sized for conns
// concurrent requests.
func NewClient(endpoint string, conns int, timeout time.Duration) *Client {
	tr := &http.Transport{
		Proxy:               nil, // a load test must hit the target, not a proxy
		DialContext:         (&net.Dialer{Timeout: timeout, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        conns,
		MaxIdleConnsPerHost: conns,
		IdleConnTimeout:     90 * time.Second,
	}
	return &Client{Endpoint: endpoint, HTTP: &http.Client{Transport: tr}, Timeout: timeout}
}

// Close drops idle connections.
func (c *Client) Close() { c.HTTP.CloseIdleConnections() }

type gqlRequest struct {
	Query     string         `json:"query"`
	Variables map[string]any `json:"variables,omitempty"`
}

type gqlResponse struct {
	Data   json.RawMessage `json:"data"`
	Errors []struct {
		Message    string         `json:"message"`
		Extensions map[string]any `json:"extensions"`
	} `json:"errors"`
}

// send makes one request to the client's server within its Timeout and
// reads the answer (body, when not nil, as JSON; bearer, when set, as the
// token). A request that got no answer is a *CallError: TIMEOUT or
// TRANSPORT.
func (c *Client) send(ctx context.Context, method, url string, body []byte, bearer string) (status int, raw []byte, err error) {
	if c.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.Timeout)
		defer cancel()
	}
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return 0, nil, &CallError{Code: CodeTransport, Err: err}
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if bearer != "" {
		req.Header.Set("Authorization", "Bearer "+bearer)
	}
	resp, err := c.HTTP.Do(req)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil {
			return 0, nil, &CallError{Code: CodeTimeout, Err: err}
		}
		return 0, nil, &CallError{Code: CodeTransport, Err: err}
	}
	defer resp.Body.Close()
	raw, err = io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		if ctx.Err() != nil {
			return 0, nil, &CallError{Code: CodeTimeout, Err: err}
		}
		return 0, nil, &CallError{Code: CodeTransport, Err: err}
	}
	return resp.StatusCode, raw, nil
}

// httpError is the *CallError of an answer that is not the one asked for:
// HTTP_<status>.
func httpError(status int, raw []byte) error {
	return &CallError{Code: fmt.Sprintf("HTTP_%d", status), Err: fmt.Errorf("status %d: %.200s", status, raw)}
}

// siteURL is path on the client's server: its endpoint without /graphql.
func (c *Client) siteURL(path string) string {
	return strings.TrimSuffix(c.Endpoint, "/graphql") + path
}

// do posts one operation and decodes data into out.
func (c *Client) do(ctx context.Context, bearer, query string, vars map[string]any, out any) error {
	body, err := json.Marshal(gqlRequest{Query: query, Variables: vars})
	if err != nil {
		return &CallError{Code: CodeBadReply, Err: err}
	}
	status, raw, err := c.send(ctx, http.MethodPost, c.Endpoint, body, bearer)
	if err != nil {
		return err
	}
	var r gqlResponse
	if err := json.Unmarshal(raw, &r); err != nil || (status >= 300 && r.Data == nil && len(r.Errors) == 0) {
		return httpError(status, raw)
	}
	if len(r.Errors) > 0 {
		code, _ := r.Errors[0].Extensions["code"].(string)
		if code == "" {
			code = "ERROR"
		}
		return &CallError{Code: "GRAPHQL_" + code, Err: errors.New(r.Errors[0].Message)}
	}
	if len(r.Data) == 0 || string(r.Data) == "null" {
		return &CallError{Code: CodeBadReply, Err: errors.New("no data in reply")}
	}
	if err := json.Unmarshal(r.Data, out); err != nil {
		return &CallError{Code: CodeBadReply, Err: err}
	}
	return nil
}

const (
	reserveDoc = `mutation Reserve($input: ReserveInput!) { reserve(input: $input) {
  reservation { token status quantity expiresAt }
  userErrors { code field message retryAfterSeconds } } }`
	commitDoc = `mutation Commit($input: CommitInput!) { commit(input: $input) {
  reservation { token status quantity expiresAt }
  userErrors { code field message retryAfterSeconds } } }`
	cancelDoc = `mutation Cancel($input: CancelInput!) { cancel(input: $input) {
  reservation { token status quantity expiresAt }
  userErrors { code field message retryAfterSeconds } } }`
	createProductDoc = `mutation CreateProduct($input: CreateProductInput!) { createProduct(input: $input) {
  product { sku maxPerUser stock { available held sold total } }
  userErrors { code field message retryAfterSeconds } } }`
	stockDoc = `query Stock($sku: ID!) { product(sku: $sku) { sku maxPerUser stock { available held sold total } } }`
)

type reservationPayload struct {
	Reservation *Reservation `json:"reservation"`
	UserErrors  []UserError  `json:"userErrors"`
}

// ReserveInput is the schema's ReserveInput.
type ReserveInput struct {
	SKU            string
	Quantity       int
	IdempotencyKey string
	HoldSeconds    int
	// AdmissionPass is the caller's pass of a queued product's admission
	// queue; empty sends none.
	AdmissionPass string
}

// mutation runs a reservation mutation and splits its payload.
func (c *Client) mutation(ctx context.Context, bearer, doc, field string, input map[string]any) (Reservation, *UserError, error) {
	var out map[string]reservationPayload
	if err := c.do(ctx, bearer, doc, map[string]any{"input": input}, &out); err != nil {
		return Reservation{}, nil, err
	}
	p := out[field]
	if len(p.UserErrors) > 0 {
		return Reservation{}, &p.UserErrors[0], nil
	}
	if p.Reservation == nil {
		return Reservation{}, nil, &CallError{Code: CodeBadReply, Err: errors.New(field + ": neither reservation nor userErrors")}
	}
	return *p.Reservation, nil, nil
}

// Reserve holds units. A business refusal comes back as a UserError; a
// failure to get any answer as a *CallError.
func (c *Client) Reserve(ctx context.Context, bearer string, in ReserveInput) (Reservation, *UserError, error) {
	input := map[string]any{"sku": in.SKU, "quantity": in.Quantity}
	if in.IdempotencyKey != "" {
		input["idempotencyKey"] = in.IdempotencyKey
	}
	if in.HoldSeconds > 0 {
		input["holdSeconds"] = in.HoldSeconds
	}
	if in.AdmissionPass != "" {
		input["admissionPass"] = in.AdmissionPass
	}
	return c.mutation(ctx, bearer, reserveDoc, "reserve", input)
}

// Commit turns a hold into a sale.
func (c *Client) Commit(ctx context.Context, bearer, token string) (Reservation, *UserError, error) {
	return c.mutation(ctx, bearer, commitDoc, "commit", map[string]any{"token": token})
}

// Cancel releases a hold.
func (c *Client) Cancel(ctx context.Context, bearer, token string) (Reservation, *UserError, error) {
	return c.mutation(ctx, bearer, cancelDoc, "cancel", map[string]any{"token": token})
}

// ProductInput is what CreateProduct sends.
type ProductInput struct {
	SKU        string
	Name       string
	Stock      int
	MaxPerUser int // 0: no limit
}

// CreateProduct creates a SKU whose sale is open now (admin token).
func (c *Client) CreateProduct(ctx context.Context, adminBearer string, in ProductInput) (*UserError, error) {
	input := map[string]any{
		"sku": in.SKU, "name": in.Name, "stock": in.Stock,
		"price": map[string]any{"amount": 100, "currency": "EUR"},
	}
	if in.MaxPerUser > 0 {
		input["maxPerUser"] = in.MaxPerUser
	}
	var out struct {
		CreateProduct struct {
			UserErrors []UserError `json:"userErrors"`
		} `json:"createProduct"`
	}
	if err := c.do(ctx, adminBearer, createProductDoc, map[string]any{"input": input}, &out); err != nil {
		return nil, err
	}
	if ue := out.CreateProduct.UserErrors; len(ue) > 0 {
		return &ue[0], nil
	}
	return nil, nil
}

// ProductInfo is what the driver reads about a SKU.
type ProductInfo struct {
	SKU        string `json:"sku"`
	MaxPerUser *int   `json:"maxPerUser"`
	Stock      Stock  `json:"stock"`
}

// Product reads a SKU and its live stock; ok is false when there is none.
func (c *Client) Product(ctx context.Context, sku string) (info ProductInfo, ok bool, err error) {
	var out struct {
		Product *ProductInfo `json:"product"`
	}
	if err := c.do(ctx, "", stockDoc, map[string]any{"sku": sku}, &out); err != nil {
		return ProductInfo{}, false, err
	}
	if out.Product == nil {
		return ProductInfo{}, false, nil
	}
	return *out.Product, true, nil
}

// Endpoint turns a base URL ("http://localhost:8080") or a full /graphql URL
// into the /graphql endpoint.
func Endpoint(base string) string {
	base = strings.TrimRight(base, "/")
	if strings.HasSuffix(base, "/graphql") {
		return base
	}
	return base + "/graphql"
}

// codeOf names the outcome of a call for the statistics.
func codeOf(ue *UserError, err error) string {
	var ce *CallError
	switch {
	case errors.As(err, &ce):
		return ce.Code
	case err != nil:
		return CodeTransport
	case ue != nil:
		return ue.Code
	}
	return CodeOK
}

// retryable reports whether an outcome leaves the request's fate unknown or
// asks the client to come back: the same request (same idempotency key,
// same token) is then sent again.
func retryable(code string) bool {
	switch code {
	case CodeTimeout, CodeTransport, "HTTP_502", "HTTP_503", "HTTP_504", "UNAVAILABLE", "RATE_LIMITED":
		return true
	}
	return false
}

// Health sends GET /healthz to the client's server, which reads and writes
// nothing: the cheapest request the server answers, the floor the
// rehearsal's commit latency is set beside (NoOpResult).
func (c *Client) Health(ctx context.Context) error {
	status, raw, err := c.send(ctx, http.MethodGet, c.siteURL("/healthz"), nil, "")
	if err != nil {
		return err
	}
	if status != http.StatusOK {
		return httpError(status, raw)
	}
	return nil
}
