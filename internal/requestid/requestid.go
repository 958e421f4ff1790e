// Package requestid carries the id the HTTP server gives each request in
// its context. The server sets it (server.RequestIDFrom reads it); the
// resolvers, which must not import the server, quote it in internal errors.
package requestid

import "context"

type key struct{}

// idContext is what context.WithValue would make of the id: the id and
// its context in one allocation instead of two (the id's interface value
// is the other).
type idContext struct {
	context.Context
	id string
}

func (c *idContext) Value(k any) any {
	if k == (key{}) {
		return c
	}
	return c.Context.Value(k)
}

// With returns ctx carrying id.
func With(ctx context.Context, id string) context.Context {
	return &idContext{Context: ctx, id: id}
}

// From returns the id ctx carries, or "" outside a request.
func From(ctx context.Context) string {
	if c, _ := ctx.Value(key{}).(*idContext); c != nil {
		return c.id
	}
	return ""
}
