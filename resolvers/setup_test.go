package resolvers_test

import (
	"testing"

	"github.com/dropline/dropline/internal/graphqltest"
	"github.com/dropline/dropline/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// The handler under test and the documents the tests share come from
// internal/graphqltest; these short names keep the tests readable.
type (
	payload     = graphqltest.Payload
	stock       = graphqltest.Stock
	product     = graphqltest.Product
	reservation = graphqltest.Reservation
)

var (
	setup = graphqltest.Setup
	only  = graphqltest.Only
	b64   = graphqltest.B64
)

const (
	stockFields       = graphqltest.StockFields
	productFields     = graphqltest.ProductFields
	reservationFields = graphqltest.ReservationFields
	userErrorFields   = graphqltest.UserErrorFields

	reserveDoc = graphqltest.ReserveDoc
	commitDoc  = graphqltest.CommitDoc
	cancelDoc  = graphqltest.CancelDoc
	createDoc  = graphqltest.CreateDoc
	updateDoc  = graphqltest.UpdateDoc
	restockDoc = graphqltest.RestockDoc
)
