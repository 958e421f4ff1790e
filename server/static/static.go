// Package static serves the build output of a web page that is embedded in
// the binary (the GraphQL playground, the demo shop): every file of a
// directory, prepared once, with a fixed Content-Security-Policy and the
// caching that content-hashed asset names allow. Pages served this way load
// nothing from a CDN or any other host, so they work offline, on air-gapped
// hosts and behind strict egress firewalls.
package static

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"mime"
	"net/http"
	"path"
	"regexp"
	"strings"
	"sync"
	"time"
)

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

// contentTypes pins the types of the extensions the builds emit, instead of
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

// ErrNoIndex is returned by Load for a directory without index.html: the
// page was never built.
var ErrNoIndex = errors.New("no index.html")

// Files is a loaded page: URL paths ("/", "/index.html", "/assets/…") mapped
// to prepared files. It never changes once loaded.
type Files struct {
	m map[string]*file
}

// Load reads every file under root (an embedded build output directory) and
// prepares it for serving. root must hold an index.html.
func Load(root fs.FS) (*Files, error) {
	m := make(map[string]*file)
	err := fs.WalkDir(root, ".", func(name string, d fs.DirEntry, err error) error {
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
		return nil, fmt.Errorf("reading embedded files: %w", err)
	}
	index, ok := m["/index.html"]
	if !ok {
		return nil, ErrNoIndex
	}
	m["/"] = index
	return &Files{m: m}, nil
}

// Embedded returns the page built into the directory dir of fsys (an
// embed.FS holding a build's output), loaded on the first call and the same
// Files on every later one. The page is named (name) and the command that
// builds it given (build) for the panic a binary without a built page
// raises on that first call: it cannot serve the page, and the mistake is
// the build's, to be fixed before it ships, not a condition to handle.
func Embedded(fsys fs.FS, dir, name, build string) func() *Files {
	return sync.OnceValue(func() *Files {
		root, err := fs.Sub(fsys, dir)
		if err == nil {
			var f *Files
			if f, err = Load(root); err == nil {
				return f
			}
		}
		if errors.Is(err, ErrNoIndex) {
			panic(name + ": embedded " + dir + " has no index.html; run `" + build + "`")
		}
		panic(name + ": " + err.Error())
	})
}

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

// Handler serves the files: index.html at "/" (and "/index.html") and every
// other file at its path. Any other path gets 404 and methods other than GET
// and HEAD get 405, so the handler can be a catch-all without answering for
// routes it does not own.
//
// Every response carries csp as its Content-Security-Policy, plus
// X-Content-Type-Options: nosniff, Referrer-Policy: no-referrer and
// X-Frame-Options: DENY. Hashed assets are cacheable forever; index.html
// must be revalidated. Conditional (ETag) and range requests are supported.
func (f *Files) Handler(csp string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", csp)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("X-Frame-Options", "DENY")

		file, ok := f.m[r.URL.Path]
		if !ok {
			http.NotFound(w, r)
			return
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			h.Set("Allow", "GET, HEAD")
			http.Error(w, http.StatusText(http.StatusMethodNotAllowed), http.StatusMethodNotAllowed)
			return
		}
		h.Set("Content-Type", file.contentType)
		h.Set("Cache-Control", file.cacheControl)
		h.Set("ETag", file.etag)
		// A zero modification time: the embedded files have none, and the
		// ETag already identifies the content.
		http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(file.content))
	})
}
