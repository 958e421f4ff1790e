package graphql

import (
	"context"
	"encoding/json"
	"strconv"
	"sync"

	gqlgen "github.com/99designs/gqlgen/graphql"
	"github.com/vektah/gqlparser/v2/ast"
	"github.com/vektah/gqlparser/v2/gqlerror"
)

// Coercing a plain reserve's variables without reflection.
//
// gqlgen's CreateOperationContext coerces every operation's variables with
// gqlparser's validator.VariableValues, which walks them by reflection: for
// the one variable of a plain reserve ($input: ReserveInput!, an object of
// a sku and a quantity, and an idempotency key and a hold length when
// given) that was about a quarter of the allocations of a
// sold-out storm's refusal and a twentieth of its CPU. What it makes of
// that shape is known without walking: the variables as they are (a sku
// that is a string is an ID, a quantity or a hold length that is an
// integer is an Int, a key that is a string is a String, and the other
// fields of ReserveInput are optional).
//
// gqlgen offers no hook in place of the coercion, so reserveVars steps
// around it: the HTTP transport marks a request whose variables have
// exactly that shape (markReserveVars); the query cache, asked for the
// document of a marked request, hands out a copy of it whose one operation
// declares no variable when the original declares exactly $input:
// ReserveInput! (so the coercion has nothing to do); and the first of the
// operation context mutators puts the original document and operation back
// with the variables, before any other extension or the execution sees the
// operation. Anything else (another shape, another declaration, a document
// not cached yet) is coerced by gqlparser as before.

// reserveVarsMark is what the transport puts in a marked request's
// context: the variables, the operation's name, and once the cache has
// handed out the copy, the original document and operation.
type reserveVarsMark struct {
	vars   map[string]any
	opName string
	doc    *ast.QueryDocument
	op     *ast.OperationDefinition
}

type reserveVarsKey struct{}

// markReserveVars returns ctx marked for params when its variables are
// exactly {"input": {"sku": a string, "quantity": an integer}}, with an
// "idempotencyKey" string and a "holdSeconds" integer when given, as the
// request's JSON decodes them (a number is a json.Number).
func markReserveVars(ctx context.Context, params *gqlgen.RawParams) context.Context {
	if !plainReserveVars(params.Variables) {
		return ctx
	}
	return &markedContext{Context: ctx, mark: reserveVarsMark{vars: params.Variables, opName: params.OperationName}}
}

// markedContext is a context marked by markReserveVars: what
// context.WithValue would make of it, the mark and its context in one
// allocation.
type markedContext struct {
	context.Context
	mark reserveVarsMark
}

func (c *markedContext) Value(key any) any {
	if key == (reserveVarsKey{}) {
		return &c.mark
	}
	return c.Context.Value(key)
}

// plainReserveVars reports whether vars is the shape whose coercion is
// known: validator.VariableValues accepts it for $input: ReserveInput! and
// gives it back unchanged. That is a sku that is a string and a quantity
// that is an integer, with an idempotencyKey that is a string and a
// holdSeconds that is an integer when given, and nothing else.
func plainReserveVars(vars map[string]any) bool {
	if len(vars) != 1 {
		return false
	}
	in, ok := vars["input"].(map[string]any)
	if !ok || len(in) < 2 || len(in) > 4 {
		return false
	}
	if _, ok := in["sku"].(string); !ok {
		return false
	}
	// What the validator asks of a json.Number given for an Int.
	isInt := func(v any) bool {
		n, ok := v.(json.Number)
		if !ok {
			return false
		}
		_, err := strconv.ParseInt(string(n), 10, 64)
		return err == nil
	}
	if !isInt(in["quantity"]) {
		return false
	}
	known := 2
	if k, given := in["idempotencyKey"]; given {
		if _, ok := k.(string); !ok {
			return false
		}
		known++
	}
	if h, given := in["holdSeconds"]; given {
		if !isInt(h) {
			return false
		}
		known++
	}
	return known == len(in)
}

// reserveVars is the query cache that hands out the copies, and the
// extension that puts the originals back.
type reserveVars struct {
	gqlgen.Cache[*ast.QueryDocument]
	// off is set when the schema's ReserveInput is not the one the shape
	// is known for.
	off bool

	mu     sync.RWMutex
	copies map[*ast.QueryDocument]*ast.QueryDocument // nil: none to make
}

const reserveVarsCopiesMax = 64

var (
	_ gqlgen.HandlerExtension        = (*reserveVars)(nil)
	_ gqlgen.OperationContextMutator = (*reserveVars)(nil)
)

func newReserveVars(cache gqlgen.Cache[*ast.QueryDocument]) *reserveVars {
	return &reserveVars{Cache: cache}
}

func (*reserveVars) ExtensionName() string { return "ReserveVariables" }

// Validate turns the copies off unless ReserveInput has a sku ID!, a
// quantity Int!, an idempotencyKey String and a holdSeconds Int if any,
// and only optional fields besides, none with a default.
func (r *reserveVars) Validate(es gqlgen.ExecutableSchema) error {
	def := es.Schema().Types["ReserveInput"]
	ok := def != nil && def.Kind == ast.InputObject
	if ok {
		for _, f := range def.Fields {
			switch f.Name {
			case "sku":
				ok = ok && f.Type.String() == "ID!" && f.DefaultValue == nil
			case "quantity":
				ok = ok && f.Type.String() == "Int!" && f.DefaultValue == nil
			case "idempotencyKey":
				ok = ok && f.Type.String() == "String" && f.DefaultValue == nil
			case "holdSeconds":
				ok = ok && f.Type.String() == "Int" && f.DefaultValue == nil
			default:
				ok = ok && !f.Type.NonNull && f.DefaultValue == nil
			}
		}
		ok = ok && def.Fields.ForName("sku") != nil && def.Fields.ForName("quantity") != nil
	}
	r.off = !ok
	return nil
}

// Get is the cache's Get; for a marked request whose document declares
// exactly $input: ReserveInput!, it gives the copy without the declaration
// and records the original in the mark.
func (r *reserveVars) Get(ctx context.Context, query string) (*ast.QueryDocument, bool) {
	doc, ok := r.Cache.Get(ctx, query)
	if !ok || r.off {
		return doc, ok
	}
	m, _ := ctx.Value(reserveVarsKey{}).(*reserveVarsMark)
	if m == nil || m.doc != nil {
		return doc, ok
	}
	c := r.copyOf(doc)
	if c == nil || doc.Operations.ForName(m.opName) == nil {
		return doc, ok
	}
	m.doc, m.op = doc, doc.Operations[0]
	return c, true
}

// copyOf returns doc's copy without its operation's variable declaration,
// or nil when doc is not one operation declaring exactly $input:
// ReserveInput!.
func (r *reserveVars) copyOf(doc *ast.QueryDocument) *ast.QueryDocument {
	r.mu.RLock()
	c, known := r.copies[doc]
	r.mu.RUnlock()
	if known {
		return c
	}
	if len(doc.Operations) == 1 && declaresReserveInput(doc.Operations[0]) {
		op := *doc.Operations[0]
		op.VariableDefinitions = nil
		d := *doc
		d.Operations = ast.OperationList{&op}
		c = &d
	}
	r.mu.Lock()
	if r.copies == nil || len(r.copies) >= reserveVarsCopiesMax {
		r.copies = make(map[*ast.QueryDocument]*ast.QueryDocument, reserveVarsCopiesMax)
	}
	r.copies[doc] = c
	r.mu.Unlock()
	return c
}

func declaresReserveInput(op *ast.OperationDefinition) bool {
	if len(op.VariableDefinitions) != 1 {
		return false
	}
	v := op.VariableDefinitions[0]
	return v.Variable == "input" && v.Type != nil && v.Type.Elem == nil && v.Type.NonNull &&
		v.Type.NamedType == "ReserveInput" && v.DefaultValue == nil && len(v.Directives) == 0 &&
		v.Definition != nil && v.Definition.Kind == ast.InputObject
}

// MutateOperationContext puts the original document and operation back,
// with the variables as validator.VariableValues would have coerced them.
// It is the first of the mutators (useExtensions installs it before all
// others), so no other extension sees the copy.
func (r *reserveVars) MutateOperationContext(ctx context.Context, opCtx *gqlgen.OperationContext) *gqlerror.Error {
	m, _ := ctx.Value(reserveVarsKey{}).(*reserveVarsMark)
	if m == nil || m.doc == nil {
		return nil
	}
	opCtx.Doc, opCtx.Operation = m.doc, m.op
	// The request's own variables, which are exactly {"input": ...}
	// (plainReserveVars) and which nothing writes to: what the coercion
	// would have copied them into.
	opCtx.Variables = m.vars
	return nil
}
