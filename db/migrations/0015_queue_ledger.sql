-- The admission queue in the ledger (docs/design.md, G15): every join,
-- numbering, admission and spent pass reaches Postgres by the write-behind,
-- like a hold, and a queue lost with Redis is rebuilt from these rows.
--
-- One row per ticket: number is NULL while its principal waits in the
-- pre-queue (pre_queue: it joined before the opening), pass and
-- pass_expires_at are set by the admission that reached its number, spent_at
-- and spent_for (the hold's token, or 'waitlist:<sku>') by the hold or join
-- the pass bought. Rows only move forward: a number, a pass and a spending
-- are each written once.
CREATE TABLE queue_tickets (
    queue_id        text        NOT NULL REFERENCES queues (id),
    principal       text        NOT NULL,
    number          bigint      CHECK (number > 0),
    pre_queue       boolean     NOT NULL,
    joined_at       timestamptz NOT NULL,
    pass            text,
    pass_expires_at timestamptz,
    admitted_at     timestamptz,
    spent_at        timestamptz,
    spent_for       text,
    PRIMARY KEY (queue_id, principal),
    CONSTRAINT queue_tickets_pass_after_number CHECK (pass IS NULL OR number IS NOT NULL),
    CONSTRAINT queue_tickets_spent_after_pass CHECK (spent_at IS NULL OR pass IS NOT NULL)
);
-- One principal per number: two principals can never share a place.
CREATE UNIQUE INDEX queue_tickets_number ON queue_tickets (queue_id, number);

-- Every queue event applied, once (its id says what happened): the audit of
-- a queue row by row, and what makes a repeated batch a no-op.
CREATE TABLE queue_movements (
    event_id    text        PRIMARY KEY,
    queue_id    text        NOT NULL,
    kind        text        NOT NULL,
    principal   text,
    first_number bigint,
    last_number  bigint,
    occurred_at timestamptz NOT NULL
);
CREATE INDEX queue_movements_queue ON queue_movements (queue_id, occurred_at);

-- The queue's progress: the size of its pre-queue, frozen at the opening
-- (NULL before), and the last number admitted.
ALTER TABLE queues ADD COLUMN pre_queue_size bigint CHECK (pre_queue_size >= 0);
ALTER TABLE queues ADD COLUMN admitted_through bigint NOT NULL DEFAULT 0 CHECK (admitted_through >= 0);
