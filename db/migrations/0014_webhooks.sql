-- Signed webhooks: what leaves Dropline besides GraphQL. An admin subscribes
-- an endpoint (a URL, its signing secret, the event types it wants); the
-- ledger writes that record a sale, a sell-out, a restock or a draw write
-- its event into the outbox (webhook_events) and one delivery per
-- subscribed endpoint (webhook_deliveries) in the same transaction, by the
-- triggers below. So an event exists exactly when the ledger row that
-- records it does: a rolled-back sale sends nothing, a committed one cannot
-- be lost, and every writer of these rows (today's and any added later) is
-- covered without remembering to call anything.
--
-- The delivery worker (worker/webhook_dispatcher.go) sends each pending
-- delivery, in event id order per endpoint and product, and records the
-- outcome here: DELIVERED, or PENDING again with a later next_attempt_at,
-- or DEAD once the attempts run out (the endpoint's dead letters, until an
-- admin redelivers them).
--
-- A new event type (the queue's, say) is one more webhook_emit call from
-- the transaction that records it, and its name in webhook.Types.

CREATE TABLE webhook_endpoints (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    url         text        NOT NULL CHECK (char_length(url) <= 2048 AND url ~ '^https?://'),
    -- The Standard Webhooks secret, "whsec_" and base64: the worker needs it
    -- in the clear to sign; only admins read it.
    secret      text        NOT NULL CHECK (secret ~ '^whsec_[A-Za-z0-9+/]+={0,2}$'),
    event_types text[]      NOT NULL CHECK (cardinality(event_types) BETWEEN 1 AND 32),
    description text        NOT NULL DEFAULT '' CHECK (char_length(description) <= 200),
    enabled     boolean     NOT NULL DEFAULT true,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- The outbox: one row per event, written only by webhook_emit and never
-- changed. payload is the body every endpoint receives ({type, timestamp,
-- data}); sku is the product the event is about, which orders deliveries.
CREATE TABLE webhook_events (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    type        text        NOT NULL,
    sku         text        NOT NULL,
    payload     jsonb       NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT now()
);

-- One row per event per endpoint subscribed to it when it was recorded.
-- claimed_until keeps a delivery in flight to one worker at a time, across
-- instances: a worker claims a delivery for longer than one request may
-- take, so a claim that lapses belongs to a worker that died.
CREATE TABLE webhook_deliveries (
    endpoint_id     bigint      NOT NULL REFERENCES webhook_endpoints (id) ON DELETE CASCADE,
    event_id        bigint      NOT NULL REFERENCES webhook_events (id),
    sku             text        NOT NULL,
    status          text        NOT NULL DEFAULT 'PENDING' CHECK (status IN ('PENDING', 'DELIVERED', 'DEAD')),
    attempts        integer     NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    claimed_until   timestamptz NOT NULL DEFAULT '-infinity',
    claimed_by      text,
    last_attempt_at timestamptz,
    last_status     integer,
    last_error      text,
    delivered_at    timestamptz,
    PRIMARY KEY (endpoint_id, event_id)
);

-- What the worker looks for: the pending deliveries of an endpoint, by
-- product, oldest first (the first of each product is the one to send).
CREATE INDEX webhook_deliveries_pending ON webhook_deliveries (endpoint_id, sku, event_id) WHERE status = 'PENDING';
CREATE INDEX webhook_deliveries_dead ON webhook_deliveries (endpoint_id, event_id) WHERE status = 'DEAD';
CREATE INDEX webhook_deliveries_by_event ON webhook_deliveries (event_id);

-- webhook_time renders a time the way every payload does: UTC, RFC 3339,
-- microseconds, whatever the session's time zone.
CREATE FUNCTION webhook_time(t timestamptz) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT to_char(t AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
$$;

-- webhook_emit records one event and its deliveries, when some enabled
-- endpoint subscribes to its type (otherwise it writes nothing: a sale
-- costs one indexed look at a small table). It first takes the product's
-- row lock, which every writer of a product's events holds or waits for
-- (a sale's UPDATE of sold, a restock's and a draw's FOR UPDATE), so the
-- ids of one product's events follow the order their transactions commit
-- in: the worker never sees an event of a product before an earlier one.
CREATE FUNCTION webhook_emit(event_type text, event_sku text, occurred timestamptz, data jsonb) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    ev bigint;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM webhook_endpoints WHERE enabled AND event_type = ANY(event_types)) THEN
        RETURN;
    END IF;
    PERFORM 1 FROM products WHERE sku = event_sku FOR NO KEY UPDATE;
    INSERT INTO webhook_events (type, sku, payload)
    VALUES (event_type, event_sku, jsonb_build_object('type', event_type, 'timestamp', webhook_time(occurred), 'data', data))
    RETURNING id INTO ev;
    INSERT INTO webhook_deliveries (endpoint_id, event_id, sku)
    SELECT id, ev, event_sku FROM webhook_endpoints WHERE enabled AND event_type = ANY(event_types);
END;
$$;

-- sale.committed: a sale row, written once per reservation (a retried
-- commit inserts nothing, so sends nothing). The price is the product's
-- when it was sold.
CREATE FUNCTION webhook_sale_committed() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    p record;
BEGIN
    SELECT price_amount, price_currency INTO p FROM products WHERE sku = NEW.sku;
    PERFORM webhook_emit('sale.committed', NEW.sku, NEW.committed_at, jsonb_build_object(
        'token', NEW.token, 'sku', NEW.sku, 'principal', NEW.principal, 'quantity', NEW.quantity,
        'cart', NEW.cart, 'committedAt', webhook_time(NEW.committed_at),
        'price', jsonb_build_object('amount', p.price_amount, 'currency', p.price_currency)));
    RETURN NULL;
END;
$$;

CREATE TRIGGER webhook_sale_committed AFTER INSERT ON sales
    FOR EACH ROW EXECUTE FUNCTION webhook_sale_committed();

-- product.sold_out and product.back_in_stock: the product's sold count
-- reaching its total (the last unit sold), and a restock lifting the total
-- above it again. Held units do not count: a hold can still end unsold.
CREATE FUNCTION webhook_stock_crossed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM webhook_emit(
        CASE WHEN NEW.sold >= NEW.total THEN 'product.sold_out' ELSE 'product.back_in_stock' END,
        NEW.sku, now(), jsonb_build_object('sku', NEW.sku, 'total', NEW.total, 'sold', NEW.sold));
    RETURN NULL;
END;
$$;

CREATE TRIGGER webhook_stock_crossed AFTER UPDATE OF sold, total ON products
    FOR EACH ROW WHEN ((OLD.sold >= OLD.total) IS DISTINCT FROM (NEW.sold >= NEW.total))
    EXECUTE FUNCTION webhook_stock_crossed();

-- restock: the restock's stock movement, recorded once per eventId. eventId
-- is the caller's, without the movement's "restock:<sku>:" scope.
CREATE FUNCTION webhook_restocked() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM webhook_emit('restock', NEW.sku, NEW.occurred_at, jsonb_build_object(
        'sku', NEW.sku, 'eventId', CASE WHEN starts_with(NEW.event_id, 'restock:' || NEW.sku || ':')
            THEN substr(NEW.event_id, char_length('restock:' || NEW.sku || ':') + 1)
            ELSE substr(NEW.event_id, char_length('restock:') + 1) END,
        'quantity', NEW.quantity, 'restockedAt', webhook_time(NEW.occurred_at)));
    RETURN NULL;
END;
$$;

CREATE TRIGGER webhook_restocked AFTER INSERT ON stock_movements
    FOR EACH ROW WHEN (NEW.kind = 'restock')
    EXECUTE FUNCTION webhook_restocked();

-- draw.drawn: a draw set DRAWN, once. The seed is revealed with it, so a
-- receiver can recompute the winners (`dropline verify-draw`).
CREATE FUNCTION webhook_draw_drawn() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM webhook_emit('draw.drawn', NEW.sku, NEW.drawn_at, jsonb_build_object(
        'sku', NEW.sku, 'entries', NEW.entries, 'winners', NEW.winners, 'stock', NEW.stock,
        'seed', encode(NEW.seed, 'hex'), 'seedHash', NEW.seed_hash, 'drawnAt', webhook_time(NEW.drawn_at)));
    RETURN NULL;
END;
$$;

CREATE TRIGGER webhook_draw_drawn AFTER UPDATE OF status ON draws
    FOR EACH ROW WHEN (OLD.status <> 'DRAWN' AND NEW.status = 'DRAWN')
    EXECUTE FUNCTION webhook_draw_drawn();
