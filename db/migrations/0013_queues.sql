-- Admission queues: a product, or a drop, sold behind a queue (docs/design.md,
-- G15). Before opens_at everyone who joins is in a pre-queue without a
-- number; at opens_at the pre-queue is shuffled from seed (its SHA-256,
-- seed_hash, is public from creation; the seed only once the queue is open)
-- with the draw's shuffle, and numbered; later joins are numbered as they
-- come. Tickets are admitted in number order, at most admit_per_minute, and
-- never more unspent passes than free units.
CREATE TABLE queues (
    id               text        PRIMARY KEY,
    sku              text        UNIQUE REFERENCES products (sku),
    drop_id          text        UNIQUE REFERENCES drops (id),
    opens_at         timestamptz NOT NULL,
    admit_per_minute integer     NOT NULL CHECK (admit_per_minute BETWEEN 1 AND 1000000),
    pass_seconds     integer     NOT NULL CHECK (pass_seconds BETWEEN 10 AND 3600),
    pow_bits         integer     NOT NULL DEFAULT 0 CHECK (pow_bits BETWEEN 0 AND 32),
    seed             bytea       NOT NULL CHECK (length(seed) = 32),
    seed_hash        text        NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT queues_one_scope CHECK ((sku IS NULL) <> (drop_id IS NULL)),
    CONSTRAINT queues_id_names_scope CHECK (id = coalesce('sku:' || sku, 'drop:' || drop_id))
);

-- Presale access codes, stored as hex SHA-256: each is used by one principal,
-- the first that joins with it.
CREATE TABLE queue_access_codes (
    queue_id  text        NOT NULL REFERENCES queues (id),
    code_hash text        NOT NULL,
    principal text,
    used_at   timestamptz,
    PRIMARY KEY (queue_id, code_hash)
);

-- products.queued marks a product sold behind a queue (its own, or its
-- drop's) for Redis, where a reserve of it asks for a pass. Set at creation
-- only; never together with draw.
ALTER TABLE products ADD COLUMN queued boolean NOT NULL DEFAULT false;
ALTER TABLE products ADD CONSTRAINT products_draw_or_queued CHECK (NOT (draw AND queued));
