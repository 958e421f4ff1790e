package db

// The ledger's queries, cut by what they store. Each type below is a view of
// one Ledger (its pool, its tracing) over its own tables; the products, the
// write-behind's batches (ApplyEvents) and a SKU's snapshot stay on Ledger.

// Draws reads and writes the draws, their entries and their results
// (draws.go).
type Draws struct{ l *Ledger }

// Draws is the ledger's draws.
func (l *Ledger) Draws() Draws { return Draws{l: l} }

// Drops reads and writes the drops and which drop a product joined
// (drops.go).
type Drops struct{ l *Ledger }

// Drops is the ledger's drops.
func (l *Ledger) Drops() Drops { return Drops{l: l} }

// Queues reads the admission queues, their tickets and their access codes
// (queues.go, queue_ledger.go).
type Queues struct{ l *Ledger }

// Queues is the ledger's admission queues.
func (l *Ledger) Queues() Queues { return Queues{l: l} }

// Reservations reads the ledger's copy of the holds and the idempotency
// keys they were made with (reservations.go).
type Reservations struct{ l *Ledger }

// Reservations is the ledger's reservations.
func (l *Ledger) Reservations() Reservations { return Reservations{l: l} }

// Sales records and reads the sales, a lone hold's or a cart's
// (reservations.go).
type Sales struct{ l *Ledger }

// Sales is the ledger's sales.
func (l *Ledger) Sales() Sales { return Sales{l: l} }

// Waitlists reads the waitlists' entries (waitlist.go); the write-behind
// writes them (ApplyEvents).
type Waitlists struct{ l *Ledger }

// Waitlists is the ledger's waitlists.
func (l *Ledger) Waitlists() Waitlists { return Waitlists{l: l} }

// Webhooks reads and writes the webhook endpoints, events and deliveries
// (webhooks.go).
type Webhooks struct{ l *Ledger }

// Webhooks is the ledger's webhook outbox.
func (l *Ledger) Webhooks() Webhooks { return Webhooks{l: l} }
