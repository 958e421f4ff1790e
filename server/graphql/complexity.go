package graphql

import (
	"context"
	"slices"

	gqlgen "github.com/99designs/gqlgen/graphql"
	"github.com/99designs/gqlgen/graphql/handler/extension"
	lru "github.com/hashicorp/golang-lru/v2"
	"github.com/vektah/gqlparser/v2/ast"
	"github.com/vektah/gqlparser/v2/gqlerror"

	"github.com/dropline/dropline/resolvers"
)

// complexityLimit is gqlgen's FixedComplexityLimit, which works an
// operation's complexity out on every request, with a memory: the
// complexity of an operation whose cost cannot depend on its variables (no
// field priced by its arguments, resolvers.PricedFields, is given a
// variable) is kept per parsed document, which gqlgen's query cache hands
// out again for the same query text. What it answers is gqlgen's own: an
// operation over the limit is always left to gqlgen, and one within it
// gets the same ComplexityStats.
type complexityLimit struct {
	*extension.ComplexityLimit
	limit int
	// known is the stats of each operation that passed and whose
	// complexity cannot depend on its variables, or nil for one whose can:
	// bounded like the query cache, whose documents it names. Every request
	// of such an operation is given the same stats, which nothing changes.
	known *lru.Cache[*ast.OperationDefinition, *extension.ComplexityStats]
}

var _ interface {
	gqlgen.HandlerExtension
	gqlgen.OperationContextMutator
} = complexityLimit{}

func newComplexityLimit(limit, size int) complexityLimit {
	known, err := lru.New[*ast.OperationDefinition, *extension.ComplexityStats](size)
	if err != nil {
		panic(err) // only for a size below 1, which Limits' defaults rule out
	}
	return complexityLimit{ComplexityLimit: extension.FixedComplexityLimit(limit), limit: limit, known: known}
}

// MutateOperationContext answers from memory for an operation it has
// priced before, and asks gqlgen otherwise.
func (c complexityLimit) MutateOperationContext(ctx context.Context, opCtx *gqlgen.OperationContext) *gqlerror.Error {
	op := opCtx.Doc.Operations.ForName(opCtx.OperationName)
	if op == nil {
		return c.ComplexityLimit.MutateOperationContext(ctx, opCtx)
	}
	if s, ok := c.known.Get(op); ok && s != nil {
		opCtx.Stats.SetExtension(c.ExtensionName(), s)
		return nil
	} else if ok {
		return c.ComplexityLimit.MutateOperationContext(ctx, opCtx)
	}
	if err := c.ComplexityLimit.MutateOperationContext(ctx, opCtx); err != nil {
		return err
	}
	var known *extension.ComplexityStats
	if !pricedByVariables(op.SelectionSet) {
		if s := extension.GetComplexityStats(gqlgen.WithOperationContext(ctx, opCtx)); s != nil {
			known = &extension.ComplexityStats{Complexity: s.Complexity, ComplexityLimit: c.limit}
		}
	}
	c.known.Add(op, known)
	return nil
}

// pricedByVariables reports whether set, or a fragment it spreads, gives a
// variable to a field whose complexity reads its arguments.
func pricedByVariables(set ast.SelectionSet) bool {
	for _, s := range set {
		switch s := s.(type) {
		case *ast.Field:
			// A field of an interface is priced as its costliest
			// implementation: taken as priced by its arguments.
			if s.ObjectDefinition == nil || s.ObjectDefinition.Kind == ast.Interface ||
				slices.Contains(resolvers.PricedFields, s.ObjectDefinition.Name+"."+s.Name) {
				for _, a := range s.Arguments {
					if usesVariable(a.Value) {
						return true
					}
				}
			}
			if pricedByVariables(s.SelectionSet) {
				return true
			}
		case *ast.InlineFragment:
			if pricedByVariables(s.SelectionSet) {
				return true
			}
		case *ast.FragmentSpread:
			if s.Definition != nil && pricedByVariables(s.Definition.SelectionSet) {
				return true
			}
		}
	}
	return false
}

func usesVariable(v *ast.Value) bool {
	if v == nil {
		return false
	}
	if v.Kind == ast.Variable {
		return true
	}
	for _, c := range v.Children {
		if usesVariable(c.Value) {
			return true
		}
	}
	return false
}
