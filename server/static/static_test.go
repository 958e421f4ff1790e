package static

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"testing/fstest"

	"github.com/stretchr/testify/require"
)

func TestLoadNeedsAnIndex(t *testing.T) {
	_, err := Load(fstest.MapFS{"assets/app-ABCDEFGH.js": {Data: []byte("x")}})
	require.True(t, errors.Is(err, ErrNoIndex), "%v", err)
}

// Embedded loads its page once, and a build without the page panics on
// first use with what to run.
func TestEmbedded(t *testing.T) {
	files := Embedded(fstest.MapFS{"dist/index.html": {Data: []byte("<html>hi</html>")}}, "dist", "page", "make page")
	first := files()
	require.NotNil(t, first)
	require.Same(t, first, files(), "loaded once")

	unbuilt := Embedded(fstest.MapFS{"dist/assets/app-ABCDEFGH.js": {Data: []byte("x")}}, "dist", "page", "make page")
	require.PanicsWithValue(t, "page: embedded dist has no index.html; run `make page`", func() { unbuilt() })
	require.PanicsWithValue(t, "page: embedded dist has no index.html; run `make page`", func() { unbuilt() }, "every use")
}

func TestHandler(t *testing.T) {
	f, err := Load(fstest.MapFS{
		"index.html":                       {Data: []byte("<html>hi</html>")},
		"assets/app-ABCDEFGH.js":           {Data: []byte("console.log(1)")},
		"assets/app-ABCDEFGH.js.LEGAL.txt": {Data: []byte("MIT")},
		"assets/plain.css":                 {Data: []byte("a{}")},
	})
	require.NoError(t, err)
	srv := httptest.NewServer(f.Handler("default-src 'none'"))
	defer srv.Close()

	cases := []struct {
		path, method string
		status       int
		ctype, cache string
	}{
		{"/", http.MethodGet, 200, "text/html; charset=utf-8", "no-cache"},
		{"/index.html", http.MethodGet, 200, "text/html; charset=utf-8", "no-cache"},
		{"/assets/app-ABCDEFGH.js", http.MethodGet, 200, "text/javascript; charset=utf-8", "public, max-age=31536000, immutable"},
		{"/assets/app-ABCDEFGH.js.LEGAL.txt", http.MethodGet, 200, "text/plain; charset=utf-8", "public, max-age=31536000, immutable"},
		{"/assets/plain.css", http.MethodGet, 200, "text/css; charset=utf-8", "no-cache"},
		{"/nope", http.MethodGet, 404, "", ""},
		{"/", http.MethodPost, 405, "", ""},
	}
	for _, c := range cases {
		req, err := http.NewRequest(c.method, srv.URL+c.path, nil)
		require.NoError(t, err)
		resp, err := srv.Client().Do(req)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		require.Equal(t, c.status, resp.StatusCode, c.path)
		require.Equal(t, "default-src 'none'", resp.Header.Get("Content-Security-Policy"), c.path)
		require.Equal(t, "nosniff", resp.Header.Get("X-Content-Type-Options"), c.path)
		if c.status == 200 {
			require.Equal(t, c.ctype, resp.Header.Get("Content-Type"), c.path)
			require.Equal(t, c.cache, resp.Header.Get("Cache-Control"), c.path)
			require.NotEmpty(t, resp.Header.Get("ETag"), c.path)
		}
	}
}
