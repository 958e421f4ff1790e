package shop

import (
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// newServer mounts the handler as the server does: under Prefix.
func newServer(t *testing.T) *httptest.Server {
	t.Helper()
	mux := http.NewServeMux()
	mux.Handle(Prefix, Handler())
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

// reply is what the tests look at of a response; its body is read and closed.
type reply struct {
	StatusCode int
	Header     http.Header
}

func get(t *testing.T, srv *httptest.Server, method, target string) (reply, string) {
	t.Helper()
	req, err := http.NewRequest(method, srv.URL+target, nil)
	require.NoError(t, err)
	client := *srv.Client()
	client.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	resp, err := client.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return reply{StatusCode: resp.StatusCode, Header: resp.Header}, string(body)
}

var (
	scriptSrc = regexp.MustCompile(`<script\b[^>]*\bsrc="([^"]*)"`)
	linkHref  = regexp.MustCompile(`<link\b[^>]*\bhref="([^"]*)"`)
	absURL    = regexp.MustCompile(`(?i)(https?:)?//[a-z0-9.-]+`)
	inline    = regexp.MustCompile(`(?i)<script\b[^>]*>[^<]+</script>|<style\b|\sstyle="|\son[a-z]+="`)
)

// TestIndexAndAssets loads the page at /shop/ and everything it refers to,
// as a browser would: all from the same server, under /shop/, with the CSP,
// and nothing inline that the CSP would block.
func TestIndexAndAssets(t *testing.T) {
	srv := newServer(t)

	resp, _ := get(t, srv, http.MethodGet, "/shop")
	require.Equal(t, http.StatusTemporaryRedirect, resp.StatusCode, "the mux sends /shop to /shop/")
	require.Equal(t, "/shop/", resp.Header.Get("Location"))

	resp, index := get(t, srv, http.MethodGet, "/shop/")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "text/html; charset=utf-8", resp.Header.Get("Content-Type"))
	require.Equal(t, "no-cache", resp.Header.Get("Cache-Control"))
	require.Equal(t, ContentSecurityPolicy, resp.Header.Get("Content-Security-Policy"))
	require.Equal(t, "nosniff", resp.Header.Get("X-Content-Type-Options"))
	require.Contains(t, index, "<title>Dropline demo shop</title>")
	require.Contains(t, index, `<div id="shop">`)
	require.Empty(t, absURL.FindAllString(index, -1), "index.html must not reference other hosts")
	require.Empty(t, inline.FindAllString(index, -1), "no inline script, style or handler: the CSP forbids them")
	require.NotContains(t, ContentSecurityPolicy, "unsafe-inline")

	base, err := url.Parse(srv.URL + "/shop/")
	require.NoError(t, err)
	var refs []string
	for _, m := range scriptSrc.FindAllStringSubmatch(index, -1) {
		refs = append(refs, m[1])
	}
	for _, m := range linkHref.FindAllStringSubmatch(index, -1) {
		refs = append(refs, m[1])
	}
	seen := map[string]bool{}
	for _, ref := range refs {
		if strings.HasPrefix(ref, "data:") {
			continue // the inline empty favicon
		}
		u, err := base.Parse(ref)
		require.NoError(t, err, ref)
		require.Equal(t, base.Host, u.Host, "%s must be served by us", ref)
		require.True(t, strings.HasPrefix(u.Path, "/shop/assets/"), "%s resolves under /shop/assets/", ref)
		resp, body := get(t, srv, http.MethodGet, u.RequestURI())
		require.Equal(t, http.StatusOK, resp.StatusCode, ref)
		require.NotEmpty(t, body, ref)
		require.Equal(t, "public, max-age=31536000, immutable", resp.Header.Get("Cache-Control"), ref)
		require.Equal(t, ContentSecurityPolicy, resp.Header.Get("Content-Security-Policy"), ref)
		seen[path.Ext(u.Path)] = true
		for _, cdn := range []string{"unpkg.com", "jsdelivr", "cdnjs", "googleapis", "gstatic", "esm.sh", "skypack"} {
			require.NotContains(t, body, cdn, "%s refers to a CDN", ref)
		}
	}
	require.True(t, seen[".js"], "index.html loads no script")
	require.True(t, seen[".css"], "index.html loads no stylesheet")
}

// TestEveryEmbeddedFileIsServed: whatever the build emitted is reachable
// under /shop/.
func TestEveryEmbeddedFileIsServed(t *testing.T) {
	srv := newServer(t)
	err := fs.WalkDir(dist, "dist", func(name string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		resp, _ := get(t, srv, http.MethodGet, "/shop"+strings.TrimPrefix(name, "dist"))
		require.Equal(t, http.StatusOK, resp.StatusCode, name)
		return nil
	})
	require.NoError(t, err)
}

func TestNotFoundAndMethods(t *testing.T) {
	srv := newServer(t)
	for _, p := range []string{"/shop/nope", "/shop/assets/", "/shop/dist/index.html", "/shop/graphql"} {
		resp, _ := get(t, srv, http.MethodGet, p)
		require.Equal(t, http.StatusNotFound, resp.StatusCode, p)
		require.Equal(t, ContentSecurityPolicy, resp.Header.Get("Content-Security-Policy"), p)
	}
	resp, _ := get(t, srv, http.MethodPost, "/shop/")
	require.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode)
	require.Equal(t, "GET, HEAD", resp.Header.Get("Allow"))
	resp, body := get(t, srv, http.MethodHead, "/shop/")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Empty(t, body)
}
