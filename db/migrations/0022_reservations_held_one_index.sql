-- One index of the HELD reservations instead of two. Every hold wrote an
-- entry of reservations_held_by_sku (sku, created_at) and one of
-- reservations_held_by_expiry (expires_at), each at the end of its index:
-- the write-behind's insert of a hold's row wrote five index entries, four
-- of the reservation's and its movement's event_id. reservations_held keyed
-- (sku, expires_at) serves what both served:
--
--   - a rebuild's and a draw's reads of a SKU's HELD rows (sku = $1), as
--     the first did; the rebuild sorts its rows itself;
--   - the overdue pass (OverdueHeld) by expiry: it walks the SKUs that have
--     HELD rows, one descent each, and reads each one's rows past their
--     expiry in expiry order, as the second served them for every SKU at
--     once.
--
-- A hold's row now writes four index entries and its movement one.
DROP INDEX reservations_held_by_sku;
DROP INDEX reservations_held_by_expiry;
CREATE INDEX reservations_held ON reservations (sku, expires_at) WHERE status = 'HELD';
