-- The waitlist of a SKU: buyers who asked to be handed units that come back
-- (a cancel, an expiry, a restock) in the order they joined. Redis keeps the
-- live queue; these rows are its ledger, written behind from the outbox (and at
-- once, best effort, by a join or a leave), and a rebuild after Redis lost its
-- data restores the queue from them in order.
--
-- seq is the entry's place in its SKU's queue: it only grows, across every life
-- of the SKU in Redis. An entry moves forward only: WAITING, then OFFERED (token
-- names the HELD reservation it was handed), then LEFT (the principal left the
-- waitlist; an OFFERED entry keeps its token).
CREATE TABLE waitlist_entries (
    sku        text        NOT NULL REFERENCES products (sku),
    seq        bigint      NOT NULL CHECK (seq > 0),
    principal  text        NOT NULL,
    quantity   integer     NOT NULL CHECK (quantity > 0),
    hold_ms    bigint      NOT NULL CHECK (hold_ms > 0),
    status     text        NOT NULL CHECK (status IN ('WAITING', 'OFFERED', 'LEFT')),
    token      text,
    joined_at  timestamptz NOT NULL,
    ended_at   timestamptz,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (sku, seq),
    CONSTRAINT waitlist_offer_has_token CHECK (status <> 'OFFERED' OR token IS NOT NULL)
);

-- A principal's entries, newest first (myWaitlist).
CREATE INDEX waitlist_entries_by_principal ON waitlist_entries (principal, joined_at DESC);
-- The live entries of a SKU, for its rebuild.
CREATE INDEX waitlist_entries_live ON waitlist_entries (sku, seq) WHERE status <> 'LEFT';

-- waitlist_movements is the waitlist's audit trail, like stock_movements: one
-- row per join, leave or offer, never updated or deleted.
CREATE TABLE waitlist_movements (
    id          bigserial   PRIMARY KEY,
    event_id    text        NOT NULL UNIQUE,
    sku         text        NOT NULL REFERENCES products (sku),
    kind        text        NOT NULL CHECK (kind IN ('wjoin', 'wleave', 'woffer')),
    principal   text        NOT NULL,
    quantity    integer     NOT NULL CHECK (quantity > 0),
    occurred_at timestamptz NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT now()
);

CREATE TRIGGER waitlist_movements_append_only
    BEFORE UPDATE OR DELETE ON waitlist_movements
    FOR EACH ROW EXECUTE FUNCTION stock_movements_append_only();
