// Package playground serves the GraphiQL playground from files embedded in the
// binary, so that people can try queries and mutations against /graphql
// without the page fetching anything from a CDN or any other host. That keeps
// it working offline, on air-gapped hosts and behind strict egress firewalls.
//
// The files in dist/ are built from web/playground (GraphiQL bundled with
// esbuild) and committed; rebuild them with `make playground`. Do not edit
// dist/ by hand.
package playground

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"io/fs"
	"mime"
	"net/http"
	"path"
	"regexp"
	"strings"
	"sync"
	"time"
)

// dist holds the build output of web/playground. The directory is embedded
// whole (index.html plus assets/) so that whatever the build emits, including
// fonts or license files, is served from the binary.
//
//go:embed dist
var dist embed.FS

// ContentSecurityPolicy is sent with every response of the handler. The page
// may load scripts, styles, fonts and images only from its own origin (fonts
// and images also as data: URLs, which GraphiQL's CSS inlines), and may
// connect only to its own origin plus WebSockets (ws:/wss:) for GraphQL
// subscriptions over graphql-transport-ws on /graphql. Styles need
// 'unsafe-inline' because GraphiQL's UI libraries write style attributes and
// <style> elements at run time. Exported so that tests and operators can see
// exactly what the page is allowed to do.
const ContentSecurityPolicy = "default-src 'none'; " +
	"script-src 'self'; " +
	"style-src 'self' 'unsafe-inline'; " +
	"img-src 'self' data:; " +
	"font-src 'self' data:; " +
	"connect-src 'self' ws: wss:; " +
	"base-uri 'none'; " +
	"form-action 'none'; " +
	"frame-ancestors 'none'"

// Cache-Control values. Asset names carry an esbuild content hash, so a
// changed file always gets a new name and may be cached forever; index.html
// keeps its name across releases, so browsers must revalidate it (cheap,
// thanks to the ETag) to pick up the new asset names after an upgrade.
const (
	cacheImmutable = "public, max-age=31536000, immutable"
	cacheNoCache   = "no-cache"
)

// hashedName matches the content hash esbuild puts in output names
// ("[name]-[hash]"), e.g. playground-NATWV4YE.js or playground-NATWV4YE.js.LEGAL.txt.
var hashedName = regexp.MustCompile(`-[A-Z0-9]{8}\.`)

// contentTypes pins the types of the extensions the build emits, instead of
// relying on mime.TypeByExtension, whose answer depends on the host's
// /etc/mime.types and so may differ between machines.
var contentTypes = map[string]string{
	".html":  "text/html; charset=utf-8",
	".js":    "text/javascript; charset=utf-8",
	".mjs":   "text/javascript; charset=utf-8",
	".css":   "text/css; charset=utf-8",
	".json":  "application/json",
	".map":   "application/json",
	".txt":   "text/plain; charset=utf-8",
	".svg":   "image/svg+xml",
	".png":   "image/png",
	".ico":   "image/x-icon",
	".woff":  "font/woff",
	".woff2": "font/woff2",
	".ttf":   "font/ttf",
	".wasm":  "application/wasm",
}

// file is one embedded file, with everything needed to serve it prepared once.
type file struct {
	content      []byte
	contentType  string
	cacheControl string
	etag         string
}

// files maps URL paths ("/", "/assets/…") to embedded files. It is built on
// first use and never changes afterwards.
var files = sync.OnceValue(func() map[string]*file {
	root, err := fs.Sub(dist, "dist")
	if err != nil {
		panic("playground: " + err.Error()) // cannot happen: dist is embedded
	}
	m := make(map[string]*file)
	err = fs.WalkDir(root, ".", func(name string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		content, err := fs.ReadFile(root, name)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(content)
		f := &file{
			content:      content,
			contentType:  typeByName(name),
			cacheControl: cacheNoCache,
			etag:         `"` + hex.EncodeToString(sum[:12]) + `"`,
		}
		if hashedName.MatchString(path.Base(name)) {
			f.cacheControl = cacheImmutable
		}
		m["/"+name] = f
		return nil
	})
	if err != nil {
		panic("playground: reading embedded files: " + err.Error())
	}
	if index, ok := m["/index.html"]; ok {
		m["/"] = index
	}
	return m
})

func typeByName(name string) string {
	ext := strings.ToLower(path.Ext(name))
	if t, ok := contentTypes[ext]; ok {
		return t
	}
	if t := mime.TypeByExtension(ext); t != "" {
		return t
	}
	return "application/octet-stream"
}

// Handler returns the handler that serves the playground: index.html at "/"
// (and "/index.html") and the bundled assets under /assets/. Any other path
// gets 404 and methods other than GET and HEAD get 405, so the handler can be
// mounted at "/" as the catch-all after /graphql, /healthz and friends without
// answering for them.
//
// Every response carries ContentSecurityPolicy and X-Content-Type-Options:
// nosniff. Hashed assets are cacheable forever; index.html must be
// revalidated. Conditional (ETag) and range requests are supported.
func Handler() http.Handler {
	m := files()
	if _, ok := m["/"]; !ok {
		panic("playground: embedded dist has no index.html; run `make playground`")
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", ContentSecurityPolicy)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("X-Frame-Options", "DENY")

		f, ok := m[r.URL.Path]
		if !ok {
			http.NotFound(w, r)
			return
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			h.Set("Allow", "GET, HEAD")
			http.Error(w, http.StatusText(http.StatusMethodNotAllowed), http.StatusMethodNotAllowed)
			return
		}
		h.Set("Content-Type", f.contentType)
		h.Set("Cache-Control", f.cacheControl)
		h.Set("ETag", f.etag)
		// A zero modification time: the embedded files have none, and the
		// ETag already identifies the content.
		http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(f.content))
	})
}
