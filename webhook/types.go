package webhook

import "slices"

// The event types an endpoint can subscribe to. Each is written into the
// outbox by the ledger write that records it (db/migrations/0014_webhooks.sql):
const (
	// SaleCommitted: a reservation or a cart line was sold (a row of sales).
	SaleCommitted = "sale.committed"
	// ProductSoldOut: a sale sold a product's last unit (sold reached total).
	ProductSoldOut = "product.sold_out"
	// ProductBackInStock: a restock lifted a sold-out product's total above
	// what is sold.
	ProductBackInStock = "product.back_in_stock"
	// Restock: units were added to a product (once per restock eventId).
	Restock = "restock"
	// DrawDrawn: a draw's winners were drawn, its seed revealed.
	DrawDrawn = "draw.drawn"
	// QueueOpened: an admission queue opened, its pre-queue numbered and
	// its seed revealed (db/migrations/0017_queue_webhooks.sql).
	QueueOpened = "queue.opened"
	// QueueAdmitted: a queue's admission moved forward to a new number.
	QueueAdmitted = "queue.admitted"
)

// Types lists every event type, in the order the documentation gives them.
// A new event is added here and emitted by the ledger write that records it,
// with webhook_emit, in a migration.
var Types = []string{SaleCommitted, ProductSoldOut, ProductBackInStock, Restock, DrawDrawn, QueueOpened, QueueAdmitted}

// KnownType reports whether t is an event type of Types.
func KnownType(t string) bool { return slices.Contains(Types, t) }
