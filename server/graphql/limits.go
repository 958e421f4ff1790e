package graphql

import (
	"context"
	"strings"

	gqlgen "github.com/99designs/gqlgen/graphql"
	"github.com/vektah/gqlparser/v2/ast"
	"github.com/vektah/gqlparser/v2/gqlerror"
)

// Codes of operations refused before execution.
const (
	CodeQueryTooDeep     = "QUERY_TOO_DEEP"
	CodeTooManyMutations = "TOO_MANY_MUTATIONS"
)

// depthLimit refuses operations whose fields nest deeper than max, before
// any resolver runs. Fragments and inline fragments add no depth;
// introspection fields (__schema, __type) are skipped: they are bounded by
// the schema and served only in dev mode.
type depthLimit struct{ max int }

var _ interface {
	gqlgen.HandlerExtension
	gqlgen.OperationContextMutator
} = depthLimit{}

// ExtensionName names the extension in gqlgen's stats.
func (depthLimit) ExtensionName() string { return "DepthLimit" }

// Validate accepts any schema.
func (depthLimit) Validate(gqlgen.ExecutableSchema) error { return nil }

// MutateOperationContext measures the operation and refuses it if too deep.
func (d depthLimit) MutateOperationContext(_ context.Context, op *gqlgen.OperationContext) *gqlerror.Error {
	if depth := selectionDepth(op.Operation.SelectionSet, d.max+1); depth > d.max {
		err := gqlerror.Errorf("query is nested too deeply: the limit is %d", d.max)
		err.Extensions = map[string]any{"code": CodeQueryTooDeep, "limit": d.max}
		return err
	}
	return nil
}

// selectionDepth returns the depth of set, stopping at cutoff so a
// pathological document cannot make the walk expensive.
func selectionDepth(set ast.SelectionSet, cutoff int) int {
	if cutoff <= 0 {
		return 0
	}
	deepest := 0
	for _, s := range set {
		var d int
		switch s := s.(type) {
		case *ast.Field:
			if strings.HasPrefix(s.Name, "__") {
				continue
			}
			d = 1 + selectionDepth(s.SelectionSet, cutoff-1)
		case *ast.InlineFragment:
			d = selectionDepth(s.SelectionSet, cutoff)
		case *ast.FragmentSpread:
			if s.Definition != nil {
				d = selectionDepth(s.Definition.SelectionSet, cutoff)
			}
		}
		if d > deepest {
			deepest = d
		}
		if deepest >= cutoff {
			return deepest
		}
	}
	return deepest
}

// mutationFieldLimit refuses mutation operations with more than max root
// fields, counted through fragments: aliasing `reserve` a thousand times in
// one request is refused whole, before any of them runs.
type mutationFieldLimit struct{ max int }

var _ interface {
	gqlgen.HandlerExtension
	gqlgen.OperationContextMutator
} = mutationFieldLimit{}

// ExtensionName names the extension in gqlgen's stats.
func (mutationFieldLimit) ExtensionName() string { return "MutationFieldLimit" }

// Validate accepts any schema.
func (mutationFieldLimit) Validate(gqlgen.ExecutableSchema) error { return nil }

// MutateOperationContext counts the root fields of a mutation.
func (m mutationFieldLimit) MutateOperationContext(_ context.Context, op *gqlgen.OperationContext) *gqlerror.Error {
	if op.Operation.Operation != ast.Mutation {
		return nil
	}
	if n := countRootFields(op.Operation.SelectionSet, m.max+1); n > m.max {
		err := gqlerror.Errorf("too many mutations in one operation: the limit is %d", m.max)
		err.Extensions = map[string]any{"code": CodeTooManyMutations, "limit": m.max}
		return err
	}
	return nil
}

func countRootFields(set ast.SelectionSet, cutoff int) int {
	n := 0
	for _, s := range set {
		switch s := s.(type) {
		case *ast.Field:
			if !strings.HasPrefix(s.Name, "__") {
				n++
			}
		case *ast.InlineFragment:
			n += countRootFields(s.SelectionSet, cutoff-n)
		case *ast.FragmentSpread:
			if s.Definition != nil {
				n += countRootFields(s.Definition.SelectionSet, cutoff-n)
			}
		}
		if n >= cutoff {
			return n
		}
	}
	return n
}
