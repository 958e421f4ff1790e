-- Draws: a product sold by draw takes entries between its sale start and its
-- draw's close instead of reserves, and its stock goes to entries picked by a
-- published, deterministic shuffle (docs/design.md, G14).
--
-- products.draw marks such a product for Redis, where a reserve of it is
-- refused. It never changes after the product is created.
ALTER TABLE products ADD COLUMN draw boolean NOT NULL DEFAULT false;

-- One row per draw product. The seed is drawn when the product is created and
-- never changes; seed_hash (hex SHA-256 of the seed) is public from the start,
-- the seed only once status is DRAWN. The draw itself is one transaction under
-- the product's row lock that sets status, winners and every entry's outcome,
-- so it happens once; applied_at says Redis has the result (the winners' holds,
-- the losers' places in the waitlist).
CREATE TABLE draws (
    sku            text        PRIMARY KEY REFERENCES products (sku),
    closes_at      timestamptz NOT NULL,
    winner_hold_ms bigint      NOT NULL CHECK (winner_hold_ms > 0),
    seed           bytea       NOT NULL CHECK (length(seed) = 32),
    seed_hash      text        NOT NULL,
    status         text        NOT NULL DEFAULT 'OPEN' CHECK (status IN ('OPEN', 'DRAWN')),
    stock          integer     CHECK (stock >= 0),
    entries        integer     CHECK (entries >= 0),
    winners        integer     CHECK (winners >= 0),
    drawn_at       timestamptz,
    applied_at     timestamptz,
    CONSTRAINT draws_drawn_has_result CHECK (status = 'OPEN' OR (drawn_at IS NOT NULL AND winners IS NOT NULL))
);

-- One row per principal per draw, never changed. id is the entry's stable
-- id: the shuffle starts from the entries sorted by it.
CREATE TABLE draw_entries (
    id         bigserial   PRIMARY KEY,
    sku        text        NOT NULL REFERENCES draws (sku),
    principal  text        NOT NULL,
    quantity   integer     NOT NULL CHECK (quantity > 0),
    entered_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    UNIQUE (sku, principal)
);

CREATE INDEX draw_entries_by_principal ON draw_entries (principal, entered_at DESC);

-- The draw's result: one row per entry, written (by COPY) in the transaction
-- that sets the draw DRAWN, never changed. place is the entry's position in
-- the shuffled order (1 first); won says it won, and token names the HELD
-- reservation it was given. An entry without a row is not drawn yet
-- (ENTERED); with one it WON or LOST. No foreign keys: the rows are written
-- only by the draw, from the entries it read under the draw's lock, and
-- checking 100,000 references would be most of a large draw's time.
CREATE TABLE draw_results (
    sku      text    NOT NULL,
    place    integer NOT NULL CHECK (place > 0),
    entry_id bigint  NOT NULL UNIQUE,
    won      boolean NOT NULL,
    token    text,
    PRIMARY KEY (sku, place),
    CONSTRAINT draw_results_won_has_token CHECK (NOT won OR token IS NOT NULL)
);
