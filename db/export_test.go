package db

import "github.com/jackc/pgx/v5/pgxpool"

// SetCopyMinRows sets the fewest fresh reservations l copies (1: every
// batch with one; a very large number: none).
func SetCopyMinRows(l *Ledger, n int) { l.copyMinRows = n }

// CopiedBatches is how many batches l wrote by COPY.
func CopiedBatches(l *Ledger) int64 { return l.copied.Load() }

// PoolOf is l's pool.
func PoolOf(l *Ledger) *pgxpool.Pool { return l.pool }
