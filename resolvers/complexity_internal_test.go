package resolvers

import (
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// PricedFields names every field the complexity root prices, so that the
// handler's memory of complexities (server/graphql) never reuses the price
// of an operation whose price reads its variables.
func TestPricedFieldsAreTheComplexityRoot(t *testing.T) {
	root := reflect.ValueOf(complexity(Limits{}.withDefaults()))
	var set []string
	for i := range root.NumField() {
		typ := root.Type().Field(i).Name
		fields := root.Field(i)
		for j := range fields.NumField() {
			if !fields.Field(j).IsNil() {
				set = append(set, strings.ToLower(typ+"."+fields.Type().Field(j).Name))
			}
		}
	}
	var want []string
	for _, f := range PricedFields {
		want = append(want, strings.ToLower(f))
	}
	slices.Sort(set)
	slices.Sort(want)
	require.Equal(t, want, set)
}
