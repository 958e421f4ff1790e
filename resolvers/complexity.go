package resolvers

import (
	"context"
	"math"
	"slices"

	gqlgen "github.com/99designs/gqlgen/graphql"

	"github.com/dropline/dropline/inventory"
	"github.com/dropline/dropline/webhook"
)

// The cost of an operation is the sum of its fields' costs, one rule for
// every field: a field costs 1 plus its selection's cost times the number
// of times the selection is resolved, which is 1 for any field but those of
// listLengths, the fields that return a list. Nested lists multiply:
// drop { products { drop { products { sku } } } } costs about 100 x 100,
// since a drop has up to 100 SKUs. Every list is priced at the most items
// it can return, so an operation never costs more, once run, than it was
// priced at before it ran (the cost counted while it runs, one per field
// resolved, is its actual cost).

// listLength is how many items a list field can return.
type listLength struct {
	// max is the most items it ever returns.
	max func(Limits) int
	// first, when set, is the argument that asks for fewer: given, the
	// list is that long (a value out of 1..max, which the resolver
	// refuses, is priced as max); absent, it is def long (max when def is
	// nil).
	first string
	def   func(Limits) int
	// each, when set, is the list argument the field answers item by
	// item: the list is as long as it (more than max is priced as max,
	// and refused before it runs: server/graphql's subgraph extension).
	each string
}

// MaxEntities is the most representations one _entities field resolves
// (a federation gateway asks for the entities of one query plan step in
// one field): a page of products, as Query.products at most.
const MaxEntities = 100

// listLengths prices every list field of the schema
// (TestEveryListIsPriced holds it to the schema). A connection is priced
// where its `first` is, on the field that returns it: its edges are that
// page, and are counted there once, not again on edges.
var listLengths = map[string]listLength{
	"Query.products":              {max: maxPage, first: "first", def: defaultPage},
	"Query.myReservations":        {max: maxPage, first: "first", def: defaultPage},
	"ProductConnection.edges":     {max: counted},
	"ReservationConnection.edges": {max: counted},
	"Query.myWaitlist":            {max: items(inventory.MaxMyWaitlist)},
	"Query.myDrawEntries":         {max: items(inventory.MaxMyDrawEntries)},
	"Drop.products":               {max: items(inventory.MaxDropSKUs), first: "first"},
	// A gateway's entity fetch costs what each entity's selection costs,
	// once per representation.
	"Query._entities": {max: items(MaxEntities), each: "representations"},
	"Cart.lines":      {max: items(inventory.MaxCartLines)},
	// A refused cart has a userError per refused line; every other
	// mutation refuses with one.
	"CartPayload.userErrors":              {max: items(inventory.MaxCartLines)},
	"ReservePayload.userErrors":           {max: items(1)},
	"CommitPayload.userErrors":            {max: items(1)},
	"CancelPayload.userErrors":            {max: items(1)},
	"ReservationPayload.userErrors":       {max: items(1)},
	"ProductPayload.userErrors":           {max: items(1)},
	"DropPayload.userErrors":              {max: items(1)},
	"WaitlistPayload.userErrors":          {max: items(1)},
	"QueueTicketPayload.userErrors":       {max: items(1)},
	"DrawEntryPayload.userErrors":         {max: items(1)},
	"Query.webhookEndpoints":              {max: items(webhook.MaxEndpoints)},
	"Query.webhookDeliveries":             {max: maxPage, first: "first", def: defaultPage},
	"WebhookEndpoint.eventTypes":          {max: items(len(webhook.Types))},
	"WebhookEndpointPayload.userErrors":   {max: items(1)},
	"RedeliverWebhooksPayload.userErrors": {max: items(1)},
	// ["input", "lines", "<index>", "quantity"] at most; a list of
	// scalars costs 1 whatever its length.
	"UserError.field": {max: items(4)},
}

func items(n int) func(Limits) int { return func(Limits) int { return n } }

func maxPage(l Limits) int     { return l.MaxPageSize }
func defaultPage(l Limits) int { return l.PageSize }

// counted is the length of a connection's edges, which its connection
// field counted already.
func counted(Limits) int { return 1 }

// length is how many items the field returns at most, given its arguments.
func (ll listLength) length(l Limits, args map[string]any) int {
	most := ll.max(l)
	if ll.each != "" {
		n := 0
		switch v := args[ll.each].(type) {
		case []any: // as the document or its variables give it
			n = len(v)
		case []map[string]any:
			n = len(v)
		}
		return min(n, most)
	}
	if ll.first == "" {
		return most
	}
	v, given := args[ll.first]
	if !given || v == nil {
		if ll.def == nil {
			return most
		}
		return ll.def(l)
	}
	n, err := gqlgen.UnmarshalInt(v)
	if err != nil || n < 1 || n > most {
		return most
	}
	return n
}

// pricedSchema is the executable schema priced by listLengths.
type pricedSchema struct {
	gqlgen.ExecutableSchema
	limits Limits
}

// Complexity prices a list field; any other field is left to gqlgen,
// which prices it 1 plus its selection.
func (s pricedSchema) Complexity(_ context.Context, typeName, field string, child int, args map[string]any) (int, bool) {
	ll, ok := listLengths[typeName+"."+field]
	if !ok {
		return 0, false
	}
	n := ll.length(s.limits, args)
	if child > 0 && n > (math.MaxInt-1)/child {
		return math.MaxInt, true
	}
	return 1 + n*child, true
}

// PricedFields are the fields ("Type.field") whose cost reads their
// arguments: an operation that passes none of them a variable costs the
// same whatever its variables are, so its cost can be worked out once per
// parsed document.
var PricedFields = pricedFields()

func pricedFields() []string {
	var out []string
	for name, ll := range listLengths {
		if ll.first != "" || ll.each != "" {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}
