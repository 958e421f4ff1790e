// Package requestid carries the id the HTTP server gives each request in
// its context. The server sets it (server.RequestIDFrom reads it); the
// resolvers, which must not import the server, quote it in internal errors.
package requestid

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"math/rand/v2"
)

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

// New returns a fresh id: 24 random hex digits. The id names a request in
// logs and error reports and guards nothing, so it comes from math/rand/v2's
// generator (seeded by the runtime, per thread, no system call) rather than
// crypto/rand.
func New() string {
	var b [12]byte
	binary.LittleEndian.PutUint64(b[:8], rand.Uint64()) //nolint:gosec // names a request, guards nothing
	binary.LittleEndian.PutUint32(b[8:], rand.Uint32()) //nolint:gosec // as above
	var out [24]byte
	hex.Encode(out[:], b[:])
	return string(out[:])
}
