-- Drops: several SKUs (the sizes of one sneaker, say) sold under one
-- per-person limit and one sale window. A SKU joins a drop when it is created
-- and never leaves it: its keys live in the drop's Redis partition, so the
-- drop-wide limit is checked in the same script as the stock.
CREATE TABLE drops (
    id             text        PRIMARY KEY CHECK (id ~ '^[A-Za-z0-9._-]{1,64}$'),
    name           text        NOT NULL CHECK (char_length(name) BETWEEN 1 AND 200),
    -- units one principal may hold or buy across every SKU of the drop
    max_per_user   integer     NOT NULL CHECK (max_per_user > 0),
    sale_starts_at timestamptz,
    sale_ends_at   timestamptz,
    -- version orders writes to Redis, like products.version; it rises when a SKU joins
    version        bigint      NOT NULL DEFAULT 1,
    created_at     timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT drops_sale_window CHECK (
        sale_starts_at IS NULL OR sale_ends_at IS NULL OR sale_ends_at > sale_starts_at)
);

ALTER TABLE products ADD COLUMN drop_id text REFERENCES drops (id);

CREATE INDEX products_by_drop ON products (drop_id, sku) WHERE drop_id IS NOT NULL;
