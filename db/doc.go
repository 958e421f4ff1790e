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
// Errors from pgx are translated here (ErrNotFound, ErrExists,
// ErrWouldOversell, ErrInvalid, ErrFenced) so callers never see driver types.
package db
