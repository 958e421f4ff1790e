-- Dropline's durable ledger. Redis holds the live state of a sale; these tables
-- hold what must survive anything: the catalogue with its stock totals, every
-- reservation, every sale, and an append-only record of each stock movement.

CREATE TABLE products (
    sku            text        PRIMARY KEY CHECK (sku ~ '^[A-Za-z0-9._-]{1,64}$'),
    name           text        NOT NULL CHECK (char_length(name) BETWEEN 1 AND 200),
    price_amount   bigint      NOT NULL CHECK (price_amount >= 0),
    price_currency text        NOT NULL CHECK (price_currency ~ '^[A-Z]{3}$'),
    -- total is the initial stock plus every restock; sold counts committed units.
    -- sold is raised only by a commit, in the same transaction as its sale row,
    -- so the CHECK below is the last line of defence against overselling.
    total          integer     NOT NULL CHECK (total >= 0),
    sold           integer     NOT NULL DEFAULT 0 CHECK (sold >= 0),
    max_per_user   integer     CHECK (max_per_user > 0),
    sale_starts_at timestamptz,
    sale_ends_at   timestamptz,
    -- version orders writes to Redis: an older product write never overwrites a newer one.
    version        bigint      NOT NULL DEFAULT 1,
    created_at     timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT products_not_oversold CHECK (sold <= total),
    CONSTRAINT products_sale_window CHECK (
        sale_starts_at IS NULL OR sale_ends_at IS NULL OR sale_ends_at > sale_starts_at)
);

-- reservations mirrors every hold. The write-behind worker creates and advances
-- rows; a commit writes its row synchronously. Status only moves forward out of
-- HELD: a late or replayed event never turns a finished reservation back.
CREATE TABLE reservations (
    token            text        PRIMARY KEY,
    sku              text        NOT NULL REFERENCES products (sku),
    principal        text        NOT NULL,
    quantity         integer     NOT NULL CHECK (quantity > 0),
    status           text        NOT NULL CHECK (status IN ('HELD', 'COMMITTED', 'CANCELLED', 'EXPIRED')),
    idempotency_hash text,
    request_hash     text,
    expires_at       timestamptz NOT NULL,
    created_at       timestamptz NOT NULL,
    committed_at     timestamptz,
    ended_at         timestamptz,
    updated_at       timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX reservations_held_by_sku ON reservations (sku, created_at) WHERE status = 'HELD';
CREATE INDEX reservations_by_principal ON reservations (principal, created_at DESC, token);
CREATE INDEX reservations_by_idempotency ON reservations (sku, idempotency_hash)
    WHERE idempotency_hash IS NOT NULL;

-- sales has one row per committed reservation. The primary key on the token is
-- what makes commit exactly-once: a retried commit finds its row and adds nothing.
CREATE TABLE sales (
    token        text        PRIMARY KEY,
    sku          text        NOT NULL REFERENCES products (sku),
    principal    text        NOT NULL,
    quantity     integer     NOT NULL CHECK (quantity > 0),
    committed_at timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX sales_by_sku ON sales (sku);

-- stock_movements is the audit trail: one row per event, never updated or
-- deleted. event_id is derived from what happened (for example "commit:<token>"),
-- so applying the same event twice is a no-op.
CREATE TABLE stock_movements (
    id          bigserial   PRIMARY KEY,
    event_id    text        NOT NULL UNIQUE,
    sku         text        NOT NULL REFERENCES products (sku),
    kind        text        NOT NULL CHECK (kind IN ('create', 'restock', 'reserve', 'commit', 'cancel', 'expire')),
    token       text,
    principal   text,
    quantity    integer     NOT NULL CHECK (quantity > 0),
    occurred_at timestamptz NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX stock_movements_by_sku ON stock_movements (sku, id);

CREATE FUNCTION stock_movements_append_only() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'stock_movements is append-only (% refused)', TG_OP;
END;
$$;

CREATE TRIGGER stock_movements_append_only
    BEFORE UPDATE OR DELETE ON stock_movements
    FOR EACH ROW EXECUTE FUNCTION stock_movements_append_only();

-- worker_fences holds, per piece of shared work, the highest lease fencing token
-- that has written. A worker that lost its lease while paused carries an older
-- token, and its writes are refused.
CREATE TABLE worker_fences (
    name       text        PRIMARY KEY,
    token      bigint      NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);
