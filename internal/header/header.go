// Package header reads a request's header fields by keys written in
// canonical form, as the request's own are: net/http stores each key of a
// request it reads in that form.
package header

import "net/http"

// Get is h.Get(key) for a key in canonical form ("Content-Type", not
// "content-type"), without canonicalizing the key again: that check of
// every byte costs a few hundred instructions a call, and a plain
// POST /graphql asks about ten. TestKeysAreCanonical checks the keys the
// server's packages give it.
func Get(h http.Header, key string) string {
	if v := h[key]; len(v) > 0 {
		return v[0]
	}
	return ""
}
