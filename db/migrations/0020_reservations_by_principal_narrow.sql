-- reservations_by_principal keyed by the principal alone. The write-behind
-- writes an entry of it for every hold, and with the creation time and the
-- token in its key each entry was unique and about 64 bytes, and each
-- principal's entries went in at a place of their own, in an index that grew
-- larger than any other of the ledger's (71 MB for 600,000 holds of 3,000
-- buyers, nearly twice the table's primary key): so a batch of 500 holds wrote into
-- about 500 pages spread over all of it. Keyed by the principal alone, equal
-- keys are stored once with a list of row pointers (B-tree deduplication):
-- the same 600,000 holds take 4.7 MB, which stays in shared buffers, and an
-- entry costs a few bytes of WAL instead of a whole index tuple.
--
-- A principal's listing (ReservationsByPrincipal) now reads all of the
-- principal's rows through it and sorts them, instead of reading only the
-- page it returns in order: for a buyer with 200 reservations, 200 heap
-- pages and a top-N sort. The listing is a buyer's own page, read far less
-- often than holds are written.
DROP INDEX reservations_by_principal;
CREATE INDEX reservations_by_principal ON reservations (principal);
