-- record_sale writes the sale of one reservation in one statement: the sale
-- row, the reservation row as COMMITTED, the movement, and the product's sold
-- count, with the checks RecordSale made one round trip at a time. Every sale
-- of a SKU updates that SKU's products row, so in a flash sale the sales of the
-- hot SKU wait for each other's row lock. Held from the UPDATE to the end of
-- the transaction, it was held across the round trips of the statements after
-- it, each one waiting for the server process to be scheduled again on a busy
-- machine; now the UPDATE comes last and the whole sale is one call, so the
-- lock is held for the UPDATE and the commit's WAL flush. A sale that waits
-- for the write-behind's transaction (it is inserting the reservation's row)
-- waits before taking it.
--
-- Refusals end the transaction (and so the sale) as an error: DL002 when the
-- ledger has the reservation as finished (its status in DETAIL), DL003 when
-- the sale would take sold above total. A token sold before returns its first
-- sale and writes nothing.
CREATE FUNCTION record_sale(p_token text, p_sku text, p_principal text, p_quantity integer, p_cart text,
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
    -- finished (the guard is evaluated on the latest row, after waiting for a
    -- writer of it).
    INSERT INTO reservations (token, sku, principal, quantity, status, idempotency_hash, request_hash,
        expires_at, created_at, committed_at)
    VALUES (p_token, p_sku, p_principal, p_quantity, 'COMMITTED', nullif(p_idempotency_hash, ''),
        nullif(p_request_hash, ''), p_expires_at, p_created_at, v_at)
    ON CONFLICT (token) DO UPDATE SET status = 'COMMITTED', committed_at = v_at, updated_at = now(),
        idempotency_hash = coalesce(reservations.idempotency_hash, excluded.idempotency_hash),
        request_hash = coalesce(reservations.request_hash, excluded.request_hash)
    WHERE reservations.status IN ('HELD', 'COMMITTED');
    IF NOT FOUND THEN
        SELECT r.status INTO v_status FROM reservations r WHERE r.token = p_token;
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
