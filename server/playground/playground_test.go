package playground

import (
	"io"
	"io/fs"
	"mime"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// get fetches target from srv and returns the response with its body read.
func get(t *testing.T, srv *httptest.Server, method, target string, header http.Header) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, srv.URL+target, nil)
	require.NoError(t, err)
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := srv.Client().Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, string(body)
}

func mediaType(t *testing.T, resp *http.Response) string {
	t.Helper()
	mt, _, err := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	require.NoError(t, err, "Content-Type %q", resp.Header.Get("Content-Type"))
	return mt
}

func requireSecurityHeaders(t *testing.T, resp *http.Response) {
	t.Helper()
	require.Equal(t, ContentSecurityPolicy, resp.Header.Get("Content-Security-Policy"))
	require.Equal(t, "nosniff", resp.Header.Get("X-Content-Type-Options"))
}

func TestIndex(t *testing.T) {
	srv := httptest.NewServer(Handler())
	defer srv.Close()

	for _, p := range []string{"/", "/index.html"} {
		resp, body := get(t, srv, http.MethodGet, p, nil)
		require.Equal(t, http.StatusOK, resp.StatusCode, p)
		require.Equal(t, "text/html", mediaType(t, resp), p)
		require.Equal(t, "no-cache", resp.Header.Get("Cache-Control"), p)
		require.NotEmpty(t, resp.Header.Get("ETag"), p)
		requireSecurityHeaders(t, resp)
		require.Contains(t, body, `<div id="graphiql">`)
		require.Contains(t, body, "<title>Dropline GraphQL playground</title>")
	}
}

var (
	scriptSrc = regexp.MustCompile(`<script\b[^>]*\bsrc="([^"]*)"`)
	linkHref  = regexp.MustCompile(`<link\b[^>]*\bhref="([^"]*)"`)
	absURL    = regexp.MustCompile(`(?i)(https?:)?//[a-z0-9.-]+`)
)

// TestIndexAssets loads every script and stylesheet that index.html refers to
// from the same server, as a browser would, and checks they come back with
// the right type and a long cache lifetime.
func TestIndexAssets(t *testing.T) {
	srv := httptest.NewServer(Handler())
	defer srv.Close()
	base, err := url.Parse(srv.URL + "/")
	require.NoError(t, err)

	_, index := get(t, srv, http.MethodGet, "/", nil)

	// Nothing in the page may point at another host, absolute or
	// protocol-relative; the page is served from our binary only.
	require.Empty(t, absURL.FindAllString(index, -1), "index.html must not reference other hosts")

	var refs []string
	for _, m := range scriptSrc.FindAllStringSubmatch(index, -1) {
		refs = append(refs, m[1])
	}
	for _, m := range linkHref.FindAllStringSubmatch(index, -1) {
		refs = append(refs, m[1])
	}
	var sawJS, sawCSS bool
	for _, ref := range refs {
		if strings.HasPrefix(ref, "data:") {
			continue // the inline empty favicon
		}
		u, err := base.Parse(ref)
		require.NoError(t, err, ref)
		require.Equal(t, base.Host, u.Host, "%s must be served by us", ref)

		resp, body := get(t, srv, http.MethodGet, u.RequestURI(), nil)
		require.Equal(t, http.StatusOK, resp.StatusCode, ref)
		require.NotEmpty(t, body, ref)
		require.Equal(t, "public, max-age=31536000, immutable", resp.Header.Get("Cache-Control"), ref)
		requireSecurityHeaders(t, resp)
		switch path.Ext(u.Path) {
		case ".js":
			sawJS = true
			require.Equal(t, "text/javascript", mediaType(t, resp), ref)
		case ".css":
			sawCSS = true
			require.Equal(t, "text/css", mediaType(t, resp), ref)
		default:
			t.Fatalf("unexpected asset %s referenced from index.html", ref)
		}
	}
	require.True(t, sawJS, "index.html loads no script")
	require.True(t, sawCSS, "index.html loads no stylesheet")
}

var (
	// cdnHosts are the usual places a web page pulls JS, CSS or fonts from.
	cdnHosts = []string{
		"unpkg.com", "jsdelivr", "cdnjs", "googleapis", "gstatic", "esm.sh",
		"skypack", "esm.run", "jspm.io", "cloudflare", "bootstrapcdn",
	}
	cssURL   = regexp.MustCompile(`url\(\s*['"]?([^'")]*)`)
	cssImprt = regexp.MustCompile(`@import`)
)

// TestBundleIsSelfContained checks the embedded JS and CSS for references to
// CDNs, for stylesheet @imports, and for url()s that are neither inline data
// nor another embedded file: the playground must work with no network beyond
// our own server.
func TestBundleIsSelfContained(t *testing.T) {
	srv := httptest.NewServer(Handler())
	defer srv.Close()

	var checked int
	err := fs.WalkDir(dist, "dist", func(name string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		ext := path.Ext(name)
		if ext != ".js" && ext != ".css" && ext != ".html" {
			return nil
		}
		checked++
		b, err := fs.ReadFile(dist, name)
		require.NoError(t, err)
		content := string(b)
		lower := strings.ToLower(content)
		for _, host := range cdnHosts {
			require.False(t, strings.Contains(lower, host), "%s references a CDN (%s)", name, host)
		}

		if ext != ".css" {
			return nil
		}
		require.False(t, cssImprt.MatchString(content), "%s uses @import", name)
		for _, m := range cssURL.FindAllStringSubmatch(content, -1) {
			ref := m[1]
			if strings.HasPrefix(ref, "data:") || strings.HasPrefix(ref, "#") {
				continue
			}
			require.NotRegexp(t, absURL, ref, "%s: url(%s) points at another host", name, ref)
			// Relative to the stylesheet's own URL.
			target := path.Join(path.Dir(strings.TrimPrefix(name, "dist")), ref)
			resp, _ := get(t, srv, http.MethodGet, target, nil)
			require.Equal(t, http.StatusOK, resp.StatusCode, "%s: url(%s)", name, ref)
		}
		return nil
	})
	require.NoError(t, err)
	require.GreaterOrEqual(t, checked, 3, "expected index.html plus JS and CSS bundles")
}

// TestEveryEmbeddedFileIsServed guards the content-type table: whatever the
// build emits must be reachable and typed, never application/octet-stream.
func TestEveryEmbeddedFileIsServed(t *testing.T) {
	srv := httptest.NewServer(Handler())
	defer srv.Close()

	err := fs.WalkDir(dist, "dist", func(name string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		p := strings.TrimPrefix(name, "dist")
		resp, _ := get(t, srv, http.MethodGet, p, nil)
		require.Equal(t, http.StatusOK, resp.StatusCode, p)
		require.NotEqual(t, "application/octet-stream", mediaType(t, resp), p)
		requireSecurityHeaders(t, resp)
		return nil
	})
	require.NoError(t, err)
}

func TestNotFound(t *testing.T) {
	srv := httptest.NewServer(Handler())
	defer srv.Close()

	for _, p := range []string{
		"/nope", "/assets/", "/assets", "/dist/index.html", "/graphql",
		"/assets/../index.html.bak", "/favicon.ico", "/index.htm",
	} {
		resp, _ := get(t, srv, http.MethodGet, p, nil)
		require.Equal(t, http.StatusNotFound, resp.StatusCode, p)
		require.Equal(t, "nosniff", resp.Header.Get("X-Content-Type-Options"), p)
	}
}

func TestMethods(t *testing.T) {
	srv := httptest.NewServer(Handler())
	defer srv.Close()

	resp, body := get(t, srv, http.MethodHead, "/", nil)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Empty(t, body)
	require.Equal(t, "text/html", mediaType(t, resp))

	for _, m := range []string{http.MethodPost, http.MethodPut, http.MethodDelete} {
		resp, _ := get(t, srv, m, "/", nil)
		require.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode, m)
		require.Equal(t, "GET, HEAD", resp.Header.Get("Allow"), m)
	}
}

// TestRevalidation checks that a browser revalidating index.html (as
// no-cache demands) gets a cheap 304.
func TestRevalidation(t *testing.T) {
	srv := httptest.NewServer(Handler())
	defer srv.Close()

	resp, _ := get(t, srv, http.MethodGet, "/", nil)
	etag := resp.Header.Get("ETag")
	require.NotEmpty(t, etag)

	resp, body := get(t, srv, http.MethodGet, "/", http.Header{"If-None-Match": {etag}})
	require.Equal(t, http.StatusNotModified, resp.StatusCode)
	require.Empty(t, body)
}
