-- reservations.dropped_at: when a rebuild of the SKU recorded this hold as
-- EXPIRED in Redis while the ledger still had it as HELD (past its expiry,
-- or no longer fitting the stock: after a promotion two acknowledged holds
-- can share a unit). The expiry itself reaches the ledger through the outbox,
-- like any other: the row stays HELD until then, so a cancel acknowledged
-- before the rebuild and still on its way through the write-behind is
-- recorded as the cancel it is, and the ledger keeps the first ending it is
-- told of, as before. What the mark changes is the sale: a commit begun
-- before the rebuild and written after it finds the row HELD, and would sell
-- a unit the rebuild has given to another buyer. record_sale and
-- record_sales now refuse a sale of a marked row as EXPIRED (DL002), as they
-- refuse one of a finished row. The rebuild sets the mark under the
-- product's row lock, before it publishes the SKU, so no sale written after
-- the rebuild misses it.
ALTER TABLE reservations ADD COLUMN dropped_at timestamptz;

-- record_sale as in migration 0018, with the guard above.
CREATE OR REPLACE FUNCTION record_sale(p_token text, p_sku text, p_principal text, p_quantity integer, p_cart text,
    p_idempotency_hash text, p_request_hash text, p_expires_at timestamptz, p_created_at timestamptz)
RETURNS TABLE (sold_sku text, sold_principal text, sold_quantity integer, sold_at timestamptz)
LANGUAGE plpgsql AS $$
DECLARE
    v_at timestamptz;
    v_status text;
BEGIN
    INSERT INTO sales (token, sku, principal, quantity, cart)
    VALUES (p_token, p_sku, p_principal, p_quantity, nullif(p_cart, ''))
    ON CONFLICT (token) DO NOTHING
    RETURNING committed_at INTO v_at;
    IF NOT FOUND THEN
        RETURN QUERY SELECT s.sku, s.principal, s.quantity, s.committed_at FROM sales s WHERE s.token = p_token;
        RETURN;
    END IF;
    -- The reservation row becomes COMMITTED unless the ledger has it as
    -- finished, or as HELD with dropped_at (a rebuild recorded it as expired
    -- in Redis; refused as EXPIRED). The guard is evaluated on the latest
    -- row, after waiting for a writer of it.
    INSERT INTO reservations (token, sku, principal, quantity, status, idempotency_hash, request_hash,
        expires_at, created_at, committed_at)
    VALUES (p_token, p_sku, p_principal, p_quantity, 'COMMITTED', nullif(p_idempotency_hash, ''),
        nullif(p_request_hash, ''), p_expires_at, p_created_at, v_at)
    ON CONFLICT (token) DO UPDATE SET status = 'COMMITTED', committed_at = v_at, updated_at = now(),
        idempotency_hash = coalesce(reservations.idempotency_hash, excluded.idempotency_hash),
        request_hash = coalesce(reservations.request_hash, excluded.request_hash)
    WHERE reservations.status = 'COMMITTED' OR (reservations.status = 'HELD' AND reservations.dropped_at IS NULL);
    IF NOT FOUND THEN
        SELECT CASE WHEN r.status = 'HELD' THEN 'EXPIRED' ELSE r.status END INTO v_status
        FROM reservations r WHERE r.token = p_token;
        RAISE EXCEPTION 'the reservation % is % in the ledger', p_token, v_status
            USING ERRCODE = 'DL002', DETAIL = coalesce(v_status, '');
    END IF;
    INSERT INTO stock_movements (event_id, sku, kind, token, principal, quantity, occurred_at)
    VALUES ('commit:' || p_token, p_sku, 'commit', p_token, p_principal, p_quantity, v_at)
    ON CONFLICT (event_id) DO NOTHING;
    -- Last: the row every sale of the SKU waits for.
    UPDATE products SET sold = sold + p_quantity, updated_at = now()
    WHERE sku = p_sku AND sold + p_quantity <= total;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'selling % of % would exceed its total', p_quantity, p_sku USING ERRCODE = 'DL003';
    END IF;
    RETURN QUERY SELECT p_sku, p_principal, p_quantity, v_at;
END;
$$;

-- record_sales as in migration 0019, with the same guard.
CREATE OR REPLACE FUNCTION record_sales(p_tokens text[], p_skus text[], p_principals text[], p_quantities integer[],
    p_idempotency_hashes text[], p_request_hashes text[], p_expires_at timestamptz[], p_created_at timestamptz[])
RETURNS TABLE (sold_token text, outcome text, sold_sku text, sold_principal text, sold_quantity integer,
    sold_at timestamptz, detail text)
LANGUAGE plpgsql AS $$
DECLARE
    v_at timestamptz;
    v_status text;
    v_skus text[] := '{}';
    v_quantities integer[] := '{}';
    v_sku text;
    v_sum bigint;
    v_lock_timeout text := current_setting('lock_timeout');
BEGIN
    -- First, holding nothing, wait for the transactions inserting the
    -- tokens' reservation rows (the write-behind's): an insert that finds
    -- the row waits for its writer, and one that does not is undone.
    FOR i IN 1 .. coalesce(array_length(p_tokens, 1), 0) LOOP
        BEGIN
            INSERT INTO reservations (token, sku, principal, quantity, status, expires_at, created_at)
            VALUES (p_tokens[i], p_skus[i], p_principals[i], p_quantities[i], 'HELD', p_expires_at[i], p_created_at[i])
            ON CONFLICT (token) DO NOTHING;
            IF FOUND THEN
                RAISE EXCEPTION 'undone' USING ERRCODE = 'DL005';
            END IF;
        EXCEPTION WHEN SQLSTATE 'DL005' THEN
            NULL;
        END;
    END LOOP;
    PERFORM set_config('lock_timeout', '2ms', true);
    FOR i IN 1 .. coalesce(array_length(p_tokens, 1), 0) LOOP
        sold_token := p_tokens[i];
        detail := NULL;
        BEGIN
            INSERT INTO sales (token, sku, principal, quantity)
            VALUES (p_tokens[i], p_skus[i], p_principals[i], p_quantities[i])
            ON CONFLICT (token) DO NOTHING
            RETURNING committed_at INTO v_at;
            IF NOT FOUND THEN
                SELECT s.sku, s.principal, s.quantity, s.committed_at
                INTO sold_sku, sold_principal, sold_quantity, sold_at
                FROM sales s WHERE s.token = p_tokens[i];
                outcome := 'replayed';
                RETURN NEXT;
                CONTINUE;
            END IF;
            INSERT INTO reservations (token, sku, principal, quantity, status, idempotency_hash, request_hash,
                expires_at, created_at, committed_at)
            VALUES (p_tokens[i], p_skus[i], p_principals[i], p_quantities[i], 'COMMITTED',
                nullif(p_idempotency_hashes[i], ''), nullif(p_request_hashes[i], ''), p_expires_at[i],
                p_created_at[i], v_at)
            ON CONFLICT (token) DO UPDATE SET status = 'COMMITTED', committed_at = v_at, updated_at = now(),
                idempotency_hash = coalesce(reservations.idempotency_hash, excluded.idempotency_hash),
                request_hash = coalesce(reservations.request_hash, excluded.request_hash)
            WHERE reservations.status = 'COMMITTED' OR (reservations.status = 'HELD' AND reservations.dropped_at IS NULL);
            IF NOT FOUND THEN
                SELECT CASE WHEN r.status = 'HELD' THEN 'EXPIRED' ELSE r.status END INTO v_status
                FROM reservations r WHERE r.token = p_tokens[i];
                RAISE EXCEPTION 'the reservation % is % in the ledger', p_tokens[i], v_status
                    USING ERRCODE = 'DL002', DETAIL = coalesce(v_status, '');
            END IF;
            INSERT INTO stock_movements (event_id, sku, kind, token, principal, quantity, occurred_at)
            VALUES ('commit:' || p_tokens[i], p_skus[i], 'commit', p_tokens[i], p_principals[i], p_quantities[i], v_at)
            ON CONFLICT (event_id) DO NOTHING;
        EXCEPTION WHEN SQLSTATE 'DL002' THEN
            GET STACKED DIAGNOSTICS detail = PG_EXCEPTION_DETAIL;
            outcome := 'ended';
            sold_sku := NULL; sold_principal := NULL; sold_quantity := NULL; sold_at := NULL;
            RETURN NEXT;
            CONTINUE;
        WHEN lock_not_available THEN
            outcome := 'busy';
            sold_sku := NULL; sold_principal := NULL; sold_quantity := NULL; sold_at := NULL;
            RETURN NEXT;
            CONTINUE;
        END;
        v_skus := v_skus || p_skus[i];
        v_quantities := v_quantities || p_quantities[i];
        outcome := 'sold';
        sold_sku := p_skus[i]; sold_principal := p_principals[i]; sold_quantity := p_quantities[i]; sold_at := v_at;
        RETURN NEXT;
    END LOOP;
    PERFORM set_config('lock_timeout', v_lock_timeout, true);
    -- Last: the rows every sale of their SKU waits for, in the order carts
    -- lock them (byte order of the SKU).
    FOR v_sku, v_sum IN
        SELECT u.sku, sum(u.quantity) FROM unnest(v_skus, v_quantities) AS u (sku, quantity)
        GROUP BY u.sku ORDER BY u.sku COLLATE "C"
    LOOP
        UPDATE products SET sold = sold + v_sum, updated_at = now()
        WHERE sku = v_sku AND sold + v_sum <= total;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'selling % more of % would exceed its total', v_sum, v_sku USING ERRCODE = 'DL004';
        END IF;
    END LOOP;
END;
$$;
