package resolvers

import (
	"github.com/dropline/dropline/graph"
	"github.com/dropline/dropline/graph/model"
)

// complexity prices connections by the page they ask for, so `first: 100`
// costs a hundred times its node.
func complexity(l Limits) graph.ComplexityRoot {
	var c graph.ComplexityRoot
	page := func(first *int) int {
		if first == nil || *first < 1 {
			return l.PageSize
		}
		if *first > l.MaxPageSize {
			return l.MaxPageSize
		}
		return *first
	}
	c.Query.Products = func(child int, first *int, _ *string) int { return 1 + page(first)*child }
	c.Query.MyReservations = func(child int, _ *model.ReservationStatus, first *int, _ *string) int {
		return 1 + page(first)*child
	}
	return c
}

// PricedFields are the fields ("Type.field") whose complexity reads their
// arguments: an operation that passes none of them a variable costs the
// same whatever its variables are, so its complexity can be worked out once
// per parsed document.
var PricedFields = []string{"Query.products", "Query.myReservations"}
