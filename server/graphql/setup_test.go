package graphql_test

import (
	"testing"

	"github.com/dropline/dropline/internal/graphqltest"
	"github.com/dropline/dropline/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// The handler under test and the documents the tests share come from
// internal/graphqltest; these short names keep the tests readable.
type (
	env      = graphqltest.Env
	gqlError = graphqltest.GQLError
	stock    = graphqltest.Stock
	product  = graphqltest.Product
)

var (
	setup  = graphqltest.Setup
	b64    = graphqltest.B64
	secret = graphqltest.Secret
)

const (
	stockFields       = graphqltest.StockFields
	productFields     = graphqltest.ProductFields
	reservationFields = graphqltest.ReservationFields
	userErrorFields   = graphqltest.UserErrorFields
)
