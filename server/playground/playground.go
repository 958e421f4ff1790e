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
	"embed"
	"net/http"

	"github.com/dropline/dropline/server/static"
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

// files is the loaded dist, read on first use and never changed afterwards.
var files = static.Embedded(dist, "dist", "playground", "make playground")

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
	return files().Handler(ContentSecurityPolicy)
}
