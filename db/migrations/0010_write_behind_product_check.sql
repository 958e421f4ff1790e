-- The write-behind's rows name their product through one check per batch
-- instead of one per row. reservations and stock_movements are written mostly
-- by the write-behind, hundreds of rows per transaction, and their foreign keys
-- to products were checked row by row: a quarter of Postgres' time per batch.
-- Every other writer of these rows already reads or locks the product in the
-- same transaction (a sale inserts into sales, whose foreign key stays; a
-- creation or a restock writes the product itself), and products are never
-- deleted. lock_products is what the write-behind's batch runs first: it takes
-- the key-share lock the foreign keys took (which waits for a rebuild's
-- snapshot of the product) on every product of the batch, in SKU order, and
-- refuses the batch as a foreign key would (SQLSTATE 23503) when one does not
-- exist.
CREATE FUNCTION lock_products(skus text[]) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    locked integer;
BEGIN
    SELECT count(*) INTO locked
    FROM (SELECT 1 FROM products WHERE sku = ANY(skus) ORDER BY sku FOR KEY SHARE) AS l;
    IF locked < coalesce(cardinality(skus), 0) THEN
        RAISE EXCEPTION 'no product %', (
            SELECT string_agg(s, ', ') FROM unnest(skus) AS s
            WHERE NOT EXISTS (SELECT 1 FROM products WHERE sku = s))
            USING ERRCODE = 'foreign_key_violation';
    END IF;
END;
$$;

ALTER TABLE reservations DROP CONSTRAINT reservations_sku_fkey;
ALTER TABLE stock_movements DROP CONSTRAINT stock_movements_sku_fkey;
