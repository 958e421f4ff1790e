// Package requestid carries the id the HTTP server gives each request in
// its context. The server sets it (server.RequestIDFrom reads it); the
// resolvers, which must not import the server, quote it in internal errors.
package requestid

import "context"

type key struct{}

// With returns ctx carrying id.
func With(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, key{}, id)
}

// From returns the id ctx carries, or "" outside a request.
func From(ctx context.Context) string {
	id, _ := ctx.Value(key{}).(string)
	return id
}
