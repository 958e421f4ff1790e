package server_test

import (
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/server"
)

func TestDevTokenIsNotFoundOutsideDevMode(t *testing.T) {
	t.Parallel()
	b := setup(t, nil) // DevToken nil, as outside dev mode
	for _, m := range []string{http.MethodGet, http.MethodPost} {
		resp, body := b.do(t, m, server.DevTokenPath, strings.NewReader(`{"user":"alice"}`), map[string]string{"Content-Type": "application/json"})
		require.Equal(t, http.StatusNotFound, resp.StatusCode, m)
		require.NotContains(t, body, "token\"", m)
	}
}

func TestDevToken(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var minted []string
	b := setup(t, func(c *server.Config) {
		c.DevToken = func(user string) (string, error) {
			mu.Lock()
			defer mu.Unlock()
			if user == "bad name" {
				return "", errors.New(`user "bad name": not a principal id`)
			}
			minted = append(minted, user)
			return "buyer-token-for-" + user, nil
		}
	})
	jsonCT := map[string]string{"Content-Type": "application/json"}

	resp, body := b.do(t, http.MethodGet, server.DevTokenPath, nil, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.JSONEq(t, `{"devSignIn":true,"usage":"POST {\"user\": NAME} for a buyer token"}`, body)

	resp, body = b.do(t, http.MethodPost, server.DevTokenPath, strings.NewReader(`{"user":"alice"}`), jsonCT)
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	require.JSONEq(t, `{"token":"buyer-token-for-alice"}`, body)
	require.Equal(t, "no-store", resp.Header.Get("Cache-Control"))

	// Same-origin requests from the shop carry an Origin of this host.
	resp, _ = b.do(t, http.MethodPost, server.DevTokenPath, strings.NewReader(`{"user":"bob"}`),
		map[string]string{"Content-Type": "application/json; charset=utf-8", "Origin": b.url})
	require.Equal(t, http.StatusOK, resp.StatusCode)

	refused := []struct {
		name    string
		method  string
		body    string
		headers map[string]string
		status  int
	}{
		{"admin is never granted", http.MethodPost, `{"user":"mallory","admin":true}`, jsonCT, http.StatusBadRequest},
		{"no user", http.MethodPost, `{}`, jsonCT, http.StatusBadRequest},
		{"not JSON", http.MethodPost, `user=alice`, jsonCT, http.StatusBadRequest},
		{"the minter's refusal", http.MethodPost, `{"user":"bad name"}`, jsonCT, http.StatusBadRequest},
		{"form posts (no preflight)", http.MethodPost, `{"user":"mallory"}`, map[string]string{"Content-Type": "text/plain"}, http.StatusUnsupportedMediaType},
		{"another site", http.MethodPost, `{"user":"mallory"}`, map[string]string{"Content-Type": "application/json", "Origin": "http://evil.example"}, http.StatusForbidden},
		{"too large", http.MethodPost, `{"user":"` + strings.Repeat("a", 2000) + `"}`, jsonCT, http.StatusRequestEntityTooLarge},
		{"other methods", http.MethodPut, `{"user":"mallory"}`, jsonCT, http.StatusMethodNotAllowed},
	}
	for _, c := range refused {
		resp, body := b.do(t, c.method, server.DevTokenPath, strings.NewReader(c.body), c.headers)
		require.Equal(t, c.status, resp.StatusCode, "%s: %s", c.name, body)
		require.NotContains(t, body, "buyer-token", c.name)
	}
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []string{"alice", "bob"}, minted, "only the accepted requests minted")
}

func TestShopRoute(t *testing.T) {
	t.Parallel()
	shop := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte("shop " + r.URL.Path))
	})
	b := setup(t, func(c *server.Config) { c.Shop = shop })
	resp, body := b.do(t, http.MethodGet, "/shop/", nil, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "shop /shop/", body)
	resp, body = b.do(t, http.MethodGet, "/shop/assets/shop-ABCDEFGH.js", nil, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "shop /shop/assets/shop-ABCDEFGH.js", body)

	b = setup(t, nil)
	resp, _ = b.do(t, http.MethodGet, "/shop/", nil, nil)
	require.Equal(t, http.StatusNotFound, resp.StatusCode, "without a shop, the catch-all answers")
}
