package resolvers

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/99designs/gqlgen/complexity"
	"github.com/stretchr/testify/require"
	"github.com/vektah/gqlparser/v2"
	"github.com/vektah/gqlparser/v2/ast"
)

func pricedTestSchema() pricedSchema {
	r := &Resolver{deps: &deps{limits: Limits{}.withDefaults()}}
	return r.Schema().(pricedSchema)
}

// Every field of the schema that returns a list, and every connection, is
// in listLengths, and listLengths names nothing else: a list added to the
// schema without a price fails here instead of costing 1 whatever it
// returns.
func TestEveryListIsPriced(t *testing.T) {
	schema := pricedTestSchema().Schema()
	var lists []string
	for _, def := range schema.Types {
		if def.Kind != ast.Object || strings.HasPrefix(def.Name, "__") {
			continue
		}
		for _, f := range def.Fields {
			if strings.HasPrefix(f.Name, "__") {
				continue
			}
			if f.Type.Elem != nil || strings.HasSuffix(f.Type.Name(), "Connection") {
				lists = append(lists, def.Name+"."+f.Name)
			}
		}
	}
	var priced []string
	for name := range listLengths {
		priced = append(priced, name)
	}
	slices.Sort(lists)
	slices.Sort(priced)
	require.Equal(t, lists, priced)

	// A field priced by an argument has it, as an Int (first) or a list
	// (each).
	for _, name := range PricedFields {
		typ, field, _ := strings.Cut(name, ".")
		ll := listLengths[name]
		if ll.each != "" {
			arg := schema.Types[typ].Fields.ForName(field).Arguments.ForName(ll.each)
			require.NotNil(t, arg, name)
			require.NotNil(t, arg.Type.Elem, name)
			continue
		}
		arg := schema.Types[typ].Fields.ForName(field).Arguments.ForName(ll.first)
		require.NotNil(t, arg, name)
		require.Equal(t, "Int", arg.Type.Name(), name)
	}
	require.Equal(t, []string{"Drop.products", "Query._entities", "Query.myReservations", "Query.products", "Query.webhookDeliveries"}, PricedFields)
}

// Nested lists multiply: each list costs its selection times the most
// items it can return.
func TestListsMultiply(t *testing.T) {
	es := pricedTestSchema()
	cost := func(query string, vars map[string]any) int {
		t.Helper()
		doc, err := gqlparser.LoadQueryWithRules(es.Schema(), query, nil)
		require.Nil(t, err, query)
		return complexity.Calculate(context.Background(), es, doc.Operations[0], vars)
	}
	for _, c := range []struct {
		query string
		want  int
	}{
		{`{ product(sku: "A") { sku } }`, 2},
		// A drop has up to 100 SKUs.
		{`{ drop(id: "D") { products { sku } } }`, 1 + 1 + 100},
		{`{ drop(id: "D") { products(first: 5) { sku } } }`, 1 + 1 + 5},
		{`{ drop(id: "D") { products { drop { products { sku } } } } }`, 1 + 1 + 100*(1+1+100)},
		// A connection is priced by its page, edges included: 20 by default.
		{`{ products { edges { node { sku } } } }`, 1 + 20*(1+1+1)},
		{`{ products(first: 3) { edges { node { sku stock { available } } } pageInfo { hasNextPage } } }`,
			1 + 3*((1+1+1+2)+2)},
		{`{ myReservations(first: 100) { edges { node { product { drop { products { sku } } } } } } }`,
			1 + 100*(1+1+1+1+1+100)},
		{`{ myWaitlist { sku } myDrawEntries { sku } }`, (1 + 100) + (1 + 100)},
		{`{ cart(token: "c") { lines { sku } } }`, 1 + 1 + 50},
		{`mutation { reserve(input: {sku: "A", quantity: 1}) { userErrors { code field } } }`, 1 + 1 + 2},
		{`mutation { reserveCart(input: {lines: []}) { userErrors { code } } }`, 1 + 1 + 50},
		// An interface's field is priced as its costliest implementation.
		{`{ node(id: "x") { ... on Drop { products { sku } } } }`, 1 + 1 + 100},
	} {
		require.Equal(t, c.want, cost(c.query, nil), c.query)
	}
	// A variable prices like the literal it stands for.
	require.Equal(t, 1+1+7, cost(`query($n: Int) { drop(id: "D") { products(first: $n) { sku } } }`, map[string]any{"n": int64(7)}))
	require.Equal(t, 1+1+100, cost(`query($n: Int) { drop(id: "D") { products(first: $n) { sku } } }`, map[string]any{"n": nil}))
	// A `first` the resolver refuses is priced at the most.
	require.Equal(t, 1+1+100, cost(`{ drop(id: "D") { products(first: 1000) { sku } } }`, nil))
}
