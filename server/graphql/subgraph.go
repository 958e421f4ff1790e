package graphql

import (
	"context"

	gqlgen "github.com/99designs/gqlgen/graphql"
	"github.com/vektah/gqlparser/v2/gqlerror"

	"github.com/dropline/dropline/resolvers"
)

// Codes of the subgraph's refusals.
const (
	// CodeSubgraphDisabled refuses _service and _entities on a server that
	// is not a subgraph (Config.Subgraph).
	CodeSubgraphDisabled = "SUBGRAPH_DISABLED"
	// CodeTooManyRepresentations refuses an _entities field of more than
	// resolvers.MaxEntities representations.
	CodeTooManyRepresentations = "TOO_MANY_REPRESENTATIONS"
)

// subgraph guards Apollo Federation's root fields. Off, _service (which
// prints the whole schema, as introspection would) and _entities are
// refused before anything runs, as a server that is no subgraph has no
// gateway to answer. On, _service answers even where introspection is off
// (a gateway composes the supergraph from it), and an _entities field may
// name at most max
// representations: each is priced as its selection (resolvers'
// complexity.go) and resolved by the same resolvers, loaders and
// authorization as the matching Query field.
type subgraph struct {
	enabled bool
	max     int
}

var _ interface {
	gqlgen.HandlerExtension
	gqlgen.OperationContextMutator
} = subgraph{}

// ExtensionName names the extension in gqlgen's stats.
func (subgraph) ExtensionName() string { return "Subgraph" }

// Validate accepts any schema.
func (subgraph) Validate(gqlgen.ExecutableSchema) error { return nil }

// MutateOperationContext refuses what the subgraph does not serve.
func (s subgraph) MutateOperationContext(ctx context.Context, op *gqlgen.OperationContext) *gqlerror.Error {
	if op.Operation == nil || op.Operation.Operation != "query" {
		return nil
	}
	service, introspection := false, false
	for _, f := range gqlgen.CollectFields(op, op.Operation.SelectionSet, []string{"Query"}) {
		switch f.Name {
		case "_service":
			service = true
		case "__schema", "__type":
			introspection = true
		}
		if f.Name != "_service" && f.Name != "_entities" {
			continue
		}
		if !s.enabled {
			err := gqlerror.Errorf("%s is served only when Dropline runs as a federation subgraph (DROPLINE_SUBGRAPH)", f.Name)
			err.Extensions = map[string]any{"code": CodeSubgraphDisabled}
			return err
		}
		if f.Name != "_entities" {
			continue
		}
		reps, _ := f.ArgumentMap(op.Variables)["representations"].([]any)
		if len(reps) > s.max {
			err := gqlerror.Errorf("_entities resolves at most %d representations, not %d", s.max, len(reps))
			err.Extensions = map[string]any{"code": CodeTooManyRepresentations, "limit": s.max}
			return err
		}
	}
	// gqlgen serves _service only where introspection is on: a gateway
	// composing the supergraph gets the SDL, and __schema stays off
	// outside dev mode.
	if service && !introspection {
		op.DisableIntrospection = false
	}
	return nil
}

// newSubgraph is the subgraph extension of a server that is one (enabled)
// or not.
func newSubgraph(enabled bool) subgraph {
	return subgraph{enabled: enabled, max: resolvers.MaxEntities}
}
