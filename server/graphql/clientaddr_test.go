package graphql_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/internal/clientaddr"
	"github.com/dropline/dropline/internal/wsclient"
	"github.com/dropline/dropline/live"
	"github.com/dropline/dropline/server/graphql"
)

// TestStreamCapsFollowTheClientAddress serves the handler behind the
// client-address middleware the server applies, trusting loopback as the
// proxy: the per-address cap then counts each forwarded client alone
// (IPv6 by its /64), while a peer that is not trusted is counted by its
// own address whatever header it sends.
func TestStreamCapsFollowTheClientAddress(t *testing.T) {
	t.Parallel()
	e := setupLive(t, live.HubConfig{}, func(c *graphql.Config) {
		c.Streams = graphql.StreamLimits{ConnsPerIP: 2}
	})
	e.CreateProduct(t, map[string]any{"sku": "ADDR-1", "stock": 5})
	proxied := func(trusted string) string {
		p, err := clientaddr.ParsePrefixes([]string{trusted})
		require.NoError(t, err)
		srv := httptest.NewServer(clientaddr.NewResolver(p, clientaddr.XForwardedFor).Middleware(e.Handler))
		t.Cleanup(srv.Close)
		return "ws" + strings.TrimPrefix(srv.URL, "http")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	dialAs := func(url, xff string) error {
		c, err := wsclient.Dial(ctx, url, wsclient.Options{Header: http.Header{"X-Forwarded-For": {xff}}})
		if err == nil {
			t.Cleanup(func() { _ = c.Close() })
		}
		return err
	}

	behindProxy := proxied("127.0.0.0/8")
	for _, client := range []string{"203.0.113.1", "203.0.113.2", "2001:db8:1:2::a"} {
		require.NoError(t, dialAs(behindProxy, "6.6.6.6, "+client), client)
		require.NoError(t, dialAs(behindProxy, client), client)
	}
	// Each client is at its cap of two; other clients are not.
	require.ErrorContains(t, dialAs(behindProxy, "203.0.113.1"), "429")
	require.ErrorContains(t, dialAs(behindProxy, "2001:db8:1:2::ffff"), "429", "IPv6 counts per /64")
	require.NoError(t, dialAs(behindProxy, "2001:db8:1:3::a"), "another /64 is another client")
	require.NoError(t, dialAs(behindProxy, "203.0.113.3"))

	// SSE takes its slot from the same count.
	res := sse(ctx, t, strings.Replace(behindProxy, "ws", "http", 1), "203.0.113.3")
	require.Equal(t, http.StatusOK, res.StatusCode)
	defer func() { _ = res.Body.Close() }()
	res2 := sse(ctx, t, strings.Replace(behindProxy, "ws", "http", 1), "203.0.113.3")
	require.Equal(t, http.StatusTooManyRequests, res2.StatusCode)
	_ = res2.Body.Close()

	// Trusting no loopback proxy, the forwarded addresses are ignored: all
	// these connections come from 127.0.0.1 and share its cap.
	direct := proxied("192.0.2.0/24")
	require.NoError(t, dialAs(direct, "198.51.100.1"))
	require.NoError(t, dialAs(direct, "198.51.100.2"))
	require.ErrorContains(t, dialAs(direct, "198.51.100.3"), "429", "a spoofed header from an untrusted peer buys no new slot")
}

func sse(ctx context.Context, t *testing.T, url, xff string) *http.Response {
	t.Helper()
	body := `{"query":"subscription { stockChanged(skus: [\"ADDR-1\"]) { available } }"}`
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("X-Forwarded-For", xff)
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	return res
}
