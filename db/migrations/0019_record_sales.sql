-- record_sales writes the sales of many reservations in one transaction:
-- group commit. Sales that arrive while another batch is on its way are sent
-- together, so the hot SKU's products row is locked once, and the WAL flushed
-- once, for all of them.
--
-- Each sale is written as record_sale writes one (the sale row, the
-- reservation row as COMMITTED, the movement), in a block of its own, so a
-- refusal is that sale's alone: the sale is answered 'ended' (the ledger has
-- the reservation as finished, its status in detail) and the others go on. A
-- token sold before answers 'replayed' with its first sale and writes
-- nothing. Only then, once all the waits for other writers of the tokens'
-- rows are over (the write-behind inserting a reservation row), are the
-- products rows updated, each SKU once with the sum of its new sales, in SKU
-- order: they are held for those updates and the commit only.
--
-- A sale must not wait for another writer while the batch holds the rows of
-- the sales before it: the write-behind inserts reservation rows in its own
-- order, and two such waits could wait for each other until PostgreSQL's
-- deadlock detection broke them, a second later. So the batch first waits,
-- holding nothing, for the writers of its tokens' reservation rows; then a
-- sale whose rows another transaction still holds for more than a moment
-- (lock_timeout) is answered 'busy', with nothing of it written, and the
-- caller sells it alone with record_sale.
--
-- When a SKU's new sales together would take sold above total, nothing is
-- written: the whole call fails with DL004, and the caller sells those
-- reservations one at a time with record_sale, which refuses (DL003) exactly
-- the ones that do not fit.
CREATE FUNCTION record_sales(p_tokens text[], p_skus text[], p_principals text[], p_quantities integer[],
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
            WHERE reservations.status IN ('HELD', 'COMMITTED');
            IF NOT FOUND THEN
                SELECT r.status INTO v_status FROM reservations r WHERE r.token = p_tokens[i];
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
