-- stock_movements' primary key on id served no query: every read of a
-- movement finds it by its event_id (a restock's retry, the write-behind's
-- ON CONFLICT (event_id)), which has a unique index of its own, while the
-- write-behind adds a movement for every event and each one also wrote an
-- entry of this index. Without it a reserve event writes five index entries
-- instead of six: the movement's insert takes one WAL record instead of two
-- and about 50 bytes less (2.05 records and 277 bytes a row against 3.06
-- and 324, not counting full-page images), and one buffer descent less.
--
-- id is still filled from its sequence, in the order movements are recorded.
-- event_id (unique, not null) identifies a row, for logical replication too.
ALTER TABLE stock_movements DROP CONSTRAINT stock_movements_pkey;
ALTER TABLE stock_movements REPLICA IDENTITY USING INDEX stock_movements_event_id_key;
