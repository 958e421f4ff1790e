// Package db is Dropline's durable ledger in PostgreSQL: the embedded
// migrations and every query the engine and the workers run.
//
// Postgres is written synchronously for what must survive anything (sales,
// catalogue changes, restocks) and by the write-behind worker for the rest
// (reserves, cancels, expiries), in idempotent batches. Constraints refuse
// what must never happen: sold above total (products_not_oversold), a second
// sale of one reservation (sales' primary key), a changed or deleted stock
// movement (an append-only trigger), a write by a fenced-off worker.
//
// The waitlists are here too (waitlist.go, migration 0005): one row per
// entry in waitlist_entries, keyed by SKU and seq, moving only forward
// (WAITING, OFFERED, LEFT), and an append-only waitlist_movements. Their
// events (wjoin, wleave, woffer) ride in the same ApplyEvents batches as the
// reservations' and are applied in the same transaction.
//
// Errors from pgx are translated here (ErrNotFound, ErrExists,
// ErrWouldOversell, ErrInvalid, ErrFenced) so callers never see driver types.
package db
