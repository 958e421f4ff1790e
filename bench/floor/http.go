// Package floor holds the floors Dropline's benchmarks divide by: the least a
// program must spend to do what one part of Dropline does, built from the
// same libraries, measured in the same run on the same machine.
//
//   - HTTPHandler: net/http and gqlgen serving Dropline's own schema, whose
//     reserve resolver returns a fixed reservation. No authentication, no
//     Redis, no limits: the cost of parsing, validating, executing and
//     encoding the reserve mutation, which no reserve can avoid.
//   - BareHandler: net/http alone writing Dropline's answer to the sold-out
//     storm's request, whatever was asked (see bare.go): what a sold-out
//     answer costs before any GraphQL.
//   - Broadcaster: a websocket server that writes one frame to every
//     connected socket (see broadcast.go).
package floor

import (
	"context"
	"net/http"
	"time"

	"github.com/99designs/gqlgen/graphql/handler"
	"github.com/99designs/gqlgen/graphql/handler/lru"
	"github.com/99designs/gqlgen/graphql/handler/transport"
	"github.com/vektah/gqlparser/v2/ast"

	"github.com/dropline/dropline/graph"
	"github.com/dropline/dropline/graph/model"
)

// HTTPHandler serves POST /graphql with the real schema. Only reserve
// answers; any other field is a nil resolver and must not be asked for.
func HTTPHandler() http.Handler {
	srv := handler.New(graph.NewExecutableSchema(graph.Config{Resolvers: root{}}))
	srv.AddTransport(transport.POST{})
	srv.SetQueryCache(lru.New[*ast.QueryDocument](1000))
	mux := http.NewServeMux()
	mux.Handle("POST /graphql", srv)
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	return mux
}

// root resolves nothing but Mutation.reserve: the embedded nil interface
// satisfies graph.ResolverRoot for the rest.
type root struct{ graph.ResolverRoot }

func (root) Mutation() graph.MutationResolver { return mutation{} }

type mutation struct{ graph.MutationResolver }

// fixed is the reservation every reserve returns.
var fixed = model.Reservation{
	ID: "UmVzZXJ2YXRpb246Zmxvb3I=", Token: "0123456789abcdef0123456789abcdef", Sku: "BENCH-HOT", Quantity: 1,
	Status: model.ReservationStatusHeld, ExpiresAt: time.Date(2030, 1, 1, 0, 10, 0, 0, time.UTC),
	CreatedAt: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC),
}

func (mutation) Reserve(_ context.Context, input model.ReserveInput) (*model.ReservePayload, error) {
	r := fixed
	r.Sku = input.Sku
	r.Quantity = input.Quantity
	return &model.ReservePayload{Reservation: &r, UserErrors: []*model.UserError{}}, nil
}
