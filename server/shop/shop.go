// Package shop serves the demo storefront at /shop: what a drop looks like
// from a buyer's side (the catalogue with live stock, Buy -> a hold with its
// countdown -> Pay, which extends it for the payment, or Cancel; the
// waitlist of a sold-out product, a cart held all or nothing, a draw),
// built on urql and graphql-ws against the server's own /graphql. Like the playground it is embedded in the binary and
// fetches nothing from any other host.
//
// The files in dist/ are built from web/shop (React, urql and graphql-ws
// bundled with esbuild) and committed; rebuild them with `make shop`. Do not
// edit dist/ by hand.
package shop

import (
	"embed"
	"net/http"

	"github.com/dropline/dropline/server/static"
)

// dist holds the build output of web/shop.
//
//go:embed dist
var dist embed.FS

// Prefix is where the shop is mounted. Its index.html refers to its assets
// by relative URLs (assets/shop-….js), so the page must be loaded as
// "/shop/", with the trailing slash; the server redirects "/shop" there.
const Prefix = "/shop/"

// ContentSecurityPolicy is sent with every response of the handler. It is
// stricter than the playground's: the shop writes no style attributes or
// <style> elements (React sets the stock bar's width through the CSSOM,
// which CSP does not govern), so styles come from its own stylesheet only.
// The page connects only to its own origin, plus WebSockets (ws:/wss:) for
// the stockChanged, reservationChanged and waitlistChanged subscriptions on
// /graphql.
const ContentSecurityPolicy = "default-src 'none'; " +
	"script-src 'self'; " +
	"style-src 'self'; " +
	"img-src 'self' data:; " +
	"connect-src 'self' ws: wss:; " +
	"base-uri 'none'; " +
	"form-action 'none'; " +
	"frame-ancestors 'none'"

// files is the loaded dist, read on first use and never changed afterwards.
var files = static.Embedded(dist, "dist", "shop", "make shop")

// Handler returns the handler for paths under Prefix, which it strips:
// index.html at "/shop/" and the bundled assets under /shop/assets/. Other
// paths get 404 and methods other than GET and HEAD get 405. Responses carry
// ContentSecurityPolicy; hashed assets are cacheable forever, index.html is
// revalidated (ETag).
func Handler() http.Handler {
	return http.StripPrefix(Prefix[:len(Prefix)-1], files().Handler(ContentSecurityPolicy))
}
