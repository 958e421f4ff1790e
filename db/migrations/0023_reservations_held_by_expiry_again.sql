-- The HELD rows' expiries get their index back. Migration 0022 served the
-- overdue pass from reservations_held (sku, expires_at) by walking every SKU
-- that has HELD rows: with 10,000 such SKUs one pass read about 40,000
-- buffers (70-140 ms), and the pass runs for every partition and token kind,
-- several times a second in all, against one index entry saved per hold.
-- With this index the pass reads only the overdue rows' pages again;
-- reservations_held still serves a rebuild's and a draw's reads of one
-- SKU's HELD rows.
CREATE INDEX reservations_held_by_expiry ON reservations (expires_at) WHERE status = 'HELD';
