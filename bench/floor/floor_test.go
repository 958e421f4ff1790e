package floor_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/bench/floor"
	"github.com/dropline/dropline/internal/wsclient"
)

func TestFloorReserveAnswersTheReservationDroplineWould(t *testing.T) {
	srv := httptest.NewServer(floor.HTTPHandler())
	defer srv.Close()
	body := `{"query":"mutation Reserve($input: ReserveInput!) { reserve(input: $input) { reservation { token sku quantity status expiresAt } userErrors { code } } }","variables":{"input":{"sku":"HOT","quantity":2}}}`
	resp, err := http.Post(srv.URL+"/graphql", "application/json", strings.NewReader(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var out struct {
		Data struct {
			Reserve struct {
				Reservation struct {
					Token, SKU, Status, ExpiresAt string
					Quantity                      int
				}
				UserErrors []any
			}
		}
		Errors []any
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
	require.Empty(t, out.Errors)
	r := out.Data.Reserve.Reservation
	require.NotEmpty(t, r.Token)
	require.Equal(t, "HOT", r.SKU)
	require.Equal(t, 2, r.Quantity)
	require.Equal(t, "HELD", r.Status)
	require.Empty(t, out.Data.Reserve.UserErrors)

	// An invalid document is refused by validation, as by Dropline.
	resp2, err := http.Post(srv.URL+"/graphql", "application/json", strings.NewReader(`{"query":"mutation { reserve { nope } }"}`))
	require.NoError(t, err)
	defer resp2.Body.Close()
	var bad struct{ Errors []any }
	require.NoError(t, json.NewDecoder(resp2.Body).Decode(&bad))
	require.NotEmpty(t, bad.Errors)
}

func TestBroadcasterWritesEachChangeToEverySubscriberOfItsSKU(t *testing.T) {
	srv := httptest.NewServer(floor.NewBroadcaster().Handler())
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	const doc = `subscription Watch($skus: [ID!]!) { stockChanged(skus: $skus) { sku available held sold total } }`
	subscribe := func(sku string) *wsclient.Subscription {
		c, err := wsclient.Dial(ctx, "ws"+strings.TrimPrefix(srv.URL, "http")+"/graphql", wsclient.Options{})
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close() })
		s, err := c.Subscribe(ctx, doc, map[string]any{"skus": []string{sku}})
		require.NoError(t, err)
		m := <-s.C // the current value
		require.Contains(t, string(m.Data), `"available":1000000`)
		return s
	}
	hot := []*wsclient.Subscription{subscribe("HOT"), subscribe("HOT"), subscribe("HOT")}
	other := subscribe("OTHER")

	resp, err := http.Post(srv.URL+"/change?sku=HOT&available=41&total=50", "text/plain", nil)
	require.NoError(t, err)
	got, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	require.Equal(t, "3\n", string(got), "sockets written")
	for _, s := range hot {
		select {
		case m := <-s.C:
			require.JSONEq(t, `{"stockChanged":{"sku":"HOT","available":41,"held":9,"sold":0,"total":50}}`, string(m.Data))
		case <-ctx.Done():
			t.Fatal("a subscriber of HOT got no value")
		}
	}
	select {
	case m := <-other.C:
		t.Fatalf("the subscriber of OTHER got %s", m.Data)
	default:
	}
}

func TestBareHandlerWritesTheSoldOutAnswer(t *testing.T) {
	srv := httptest.NewServer(floor.BareHandler())
	defer srv.Close()
	body := `{"query":"mutation Reserve($input: ReserveInput!) { reserve(input: $input) { reservation { token expiresAt } userErrors { code retryAfterSeconds } } }","variables":{"input":{"quantity":1,"sku":"BENCH-SOLD-OUT"}}}`
	ids := map[string]bool{}
	for range 2 {
		resp, err := http.Post(srv.URL+"/graphql", "application/json", strings.NewReader(body))
		require.NoError(t, err)
		got, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		require.Equal(t, "application/json", resp.Header.Get("Content-Type"))
		require.Equal(t, `"cost";q=10000;w=10`, resp.Header.Get("RateLimit-Policy"))
		require.Regexp(t, `^"cost";r=\d+;t=\d+$`, resp.Header.Get("RateLimit"))
		require.Regexp(t, `^[0-9a-f]{24}$`, resp.Header.Get("X-Request-Id"))
		ids[resp.Header.Get("X-Request-Id")] = true
		require.Equal(t, int64(len(got)), resp.ContentLength, "one write, its length declared")
		// The storm's wrk script counts an answer with OUT_OF_STOCK and no
		// token as out of stock.
		require.Contains(t, string(got), "OUT_OF_STOCK")
		require.NotContains(t, string(got), `"token":"`)
		var out struct {
			Data struct {
				Reserve struct {
					Reservation *struct{}
					UserErrors  []struct {
						Code              string
						RetryAfterSeconds *int
					}
				}
			}
			Extensions struct {
				Cost struct{ RequestedQueryCost, ActualQueryCost int }
			}
		}
		require.NoError(t, json.Unmarshal(got, &out))
		require.Nil(t, out.Data.Reserve.Reservation)
		require.Len(t, out.Data.Reserve.UserErrors, 1)
		require.Equal(t, "OUT_OF_STOCK", out.Data.Reserve.UserErrors[0].Code)
		require.Nil(t, out.Data.Reserve.UserErrors[0].RetryAfterSeconds)
		require.Positive(t, out.Extensions.Cost.ActualQueryCost)
	}
	require.Len(t, ids, 2, "a fresh request id each time")

	// A body over the limit is refused, not read to its end.
	resp, err := http.Post(srv.URL+"/graphql", "application/json", strings.NewReader(strings.Repeat(" ", floor.BareBodyBytes+1)))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode)

	resp, err = http.Get(srv.URL + "/readyz")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
}
