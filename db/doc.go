// Package db is Dropline's durable ledger in PostgreSQL: the embedded
// migrations and every query the engine and the workers run.
//
// Postgres is written synchronously for what must survive anything (sales,
// catalogue changes, restocks) and by the write-behind worker for the rest
// (reserves, cancels, expiries), in idempotent batches. Constraints refuse
// what must never happen: sold above total (products_not_oversold), a second
// sale of one reservation (sales' primary key), a changed or deleted stock
// movement (an append-only trigger), a write by a fenced-off worker
// (worker_fence). A write-behind batch naming a product that does not exist
// is refused once per batch (lock_products), not row by row: reservations
// and stock_movements have no foreign key to products, since every other
// writer of theirs reads or locks the product in its transaction and
// products are never deleted. A hold whose only event in a batch is its
// reserve is written by plain inserts, without the lookups an upsert makes
// first; a batch in which such a row exists after all fails on the unique
// violation and is sent again with every row an upsert.
//
// The waitlists are here too (waitlist.go, migration 0005): one row per
// entry in waitlist_entries, keyed by SKU and seq, moving only forward
// (WAITING, OFFERED, LEFT), and an append-only waitlist_movements. Their
// events (wjoin, wleave, woffer) ride in the same ApplyEvents batches as the
// reservations' and are applied in the same transaction.
//
// A cart is sold in one transaction (Sales.RecordCartSale): its row in carts
// (token, principal, lines: how many sales it has) and one sale per line,
// each naming it in sales.cart. Either the row and every sale exist, or
// none: a reader checks a cart by counting sales.cart against carts.lines.
// The lines' reservations are written like any other (by the write-behind,
// then COMMITTED by the sale); a line is told from a lone hold by its token
// ("l07." rather than "r07.").
//
// So are the draws (draws.go, migration 0007): draws (one row per product
// sold by draw: seed, seedHash, status), draw_entries (one row per principal,
// never changed; its id orders the shuffle) and draw_results (one row per
// entry, written by COPY in the transaction that sets the draw DRAWN).
//
// The webhook outbox is here too (webhooks.go, migration 0014): endpoints,
// one webhook_events row per event and one webhook_deliveries row per event
// and subscribed endpoint, written by triggers on sales, products,
// stock_movements and draws in the transaction of the ledger write that
// records the event, so an event exists exactly when its record does. The
// delivery worker claims the oldest pending delivery of each product and
// endpoint (SKIP LOCKED, with a claim that outlasts one attempt) and
// records each attempt's outcome.
//
// Errors from pgx are translated here (ErrNotFound, ErrExists,
// ErrWouldOversell, ErrInvalid, ErrFenced) so callers never see driver types.
package db
