package e2e

import (
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

const reserveMutation = `mutation($input: ReserveInput!) {
  reserve(input: $input) { reservation { token status quantity expiresAt } userErrors { code field message } } }`

const commitMutation = `mutation($token: ID!) {
  commit(input: {token: $token}) { reservation { token status } userErrors { code message } } }`

// A drop as the design describes it, over HTTP: 500 buyers at once for 20
// units. Exactly 20 win, every winner commits (twice, concurrently), and the
// Postgres ledger ends up agreeing with what the clients were told.
func TestDropOverHTTP(t *testing.T) {
	t.Parallel()
	s := start(t)
	s.createProduct(t, "E2E-HOT", 20, 1)
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 100}}

	const buyers = 500
	tokens := make([]string, buyers)
	for i := range tokens {
		tokens[i] = s.token(t, buyerName(i), false)
	}
	// The goroutines only record what they were told; the test checks it
	// afterwards, on its own goroutine.
	type reserveOutcome struct {
		r   gqlResponse
		err error
		out struct {
			Reserve struct {
				Reservation *reservation `json:"reservation"`
				UserErrors  []userError  `json:"userErrors"`
			} `json:"reserve"`
		}
	}
	reserves := make([]reserveOutcome, buyers)
	var wg sync.WaitGroup
	startGun := make(chan struct{})
	for i := range reserves {
		wg.Go(func() {
			<-startGun
			o := &reserves[i]
			o.r, o.err = s.tryGQL(client, tokens[i], reserveMutation, map[string]any{"input": map[string]any{
				"sku": "E2E-HOT", "quantity": 1, "idempotencyKey": "cart-" + buyerName(i)}}, &o.out)
		})
	}
	close(startGun)
	wg.Wait()
	won := map[int]string{}
	outOfStock := 0
	for i, o := range reserves {
		require.NoError(t, o.err, "buyer %d", i)
		require.Empty(t, o.r.Errors, "buyer %d", i)
		if o.out.Reserve.Reservation != nil {
			won[i] = o.out.Reserve.Reservation.Token
			continue
		}
		require.Len(t, o.out.Reserve.UserErrors, 1, "buyer %d", i)
		require.Equal(t, "OUT_OF_STOCK", o.out.Reserve.UserErrors[0].Code, "buyer %d", i)
		outOfStock++
	}
	require.Len(t, won, 20)
	require.Equal(t, buyers-20, outOfStock)
	require.Equal(t, stock{Available: 0, Held: 20, Sold: 0, Total: 20}, s.stock(t, "E2E-HOT"))

	type commitOutcome struct {
		r   gqlResponse
		err error
		out struct {
			Commit struct {
				Reservation *reservation `json:"reservation"`
				UserErrors  []userError  `json:"userErrors"`
			} `json:"commit"`
		}
	}
	var commits []*commitOutcome
	for i, tok := range won {
		for range 2 {
			o := &commitOutcome{}
			commits = append(commits, o)
			wg.Go(func() {
				o.r, o.err = s.tryGQL(client, tokens[i], commitMutation, map[string]any{"token": tok}, &o.out)
			})
		}
	}
	wg.Wait()
	committed := 0
	for _, o := range commits {
		require.NoError(t, o.err)
		require.Empty(t, o.r.Errors)
		require.Empty(t, o.out.Commit.UserErrors)
		require.NotNil(t, o.out.Commit.Reservation)
		require.Equal(t, "COMMITTED", o.out.Commit.Reservation.Status)
		committed++
	}
	require.Equal(t, 40, committed)
	require.Equal(t, stock{Available: 0, Held: 0, Sold: 20, Total: 20}, s.stock(t, "E2E-HOT"))

	// Commits are in Postgres already; the reserves arrive by write-behind.
	require.Equal(t, 20, s.scalar(t, `SELECT count(*) FROM sales WHERE sku = 'E2E-HOT'`))
	require.Equal(t, 20, s.scalar(t, `SELECT sold FROM products WHERE sku = 'E2E-HOT'`))
	require.Eventually(t, func() bool {
		return s.scalar(t, `SELECT count(*) FROM stock_movements WHERE sku = 'E2E-HOT' AND kind = 'reserve'`) == 20
	}, 10*time.Second, 50*time.Millisecond, "the write-behind records every reserve")
	require.Equal(t, 20, s.scalar(t, `SELECT count(*) FROM stock_movements WHERE sku = 'E2E-HOT' AND kind = 'commit'`))
	require.Equal(t, 20, s.scalar(t, `SELECT count(*) FROM reservations WHERE sku = 'E2E-HOT' AND status = 'COMMITTED'`))
	require.Equal(t, 0, s.scalar(t, `SELECT count(*) FROM stock_movements GROUP BY event_id HAVING count(*) > 1 UNION ALL SELECT 0`))
}

// The operator's surface: health, readiness, metrics, and the playground with
// every asset it references, all from the binary itself.
func TestOperatorAndPlaygroundEndpoints(t *testing.T) {
	t.Parallel()
	s := start(t)
	get := func(path string) (int, string, http.Header) {
		resp, err := http.Get(s.URL + path)
		require.NoError(t, err)
		defer resp.Body.Close()
		var b strings.Builder
		_, err = ioCopy(&b, resp)
		require.NoError(t, err)
		return resp.StatusCode, b.String(), resp.Header
	}
	code, _, _ := get("/healthz")
	require.Equal(t, 200, code)
	code, body, _ := get("/readyz")
	require.Equal(t, 200, code, body)
	require.Contains(t, body, `"ready"`)
	code, body, _ = get("/metrics")
	require.Equal(t, 200, code)
	require.Contains(t, body, "dropline_writebehind_lag_seconds")
	require.Contains(t, body, "dropline_inventory_rebuilds_total")

	code, page, hdr := get("/")
	require.Equal(t, 200, code)
	require.Contains(t, hdr.Get("Content-Type"), "text/html")
	require.Contains(t, page, "<script")
	assets := 0
	for _, attr := range []string{`src="`, `href="`} {
		for rest := page; ; {
			i := strings.Index(rest, attr)
			if i < 0 {
				break
			}
			rest = rest[i+len(attr):]
			ref := rest[:strings.Index(rest, `"`)]
			if strings.HasPrefix(ref, "/") || strings.HasPrefix(ref, "./") || strings.HasPrefix(ref, "assets/") {
				c, _, _ := get("/" + strings.TrimPrefix(strings.TrimPrefix(ref, "./"), "/"))
				require.Equal(t, 200, c, ref)
				assets++
			}
		}
	}
	require.GreaterOrEqual(t, assets, 2, "the page's script and stylesheet come from this server")
}
