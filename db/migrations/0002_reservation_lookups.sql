-- Lookups that repair Redis from the ledger after Redis lost its data.

-- HELD reservations by expiry: the commit reconciler closes those past their
-- expiry that Redis no longer holds (a reserve whose event reached Postgres
-- only after its SKU was rebuilt without it).
CREATE INDEX reservations_held_by_expiry ON reservations (expires_at) WHERE status = 'HELD';

-- Reservations by idempotency key alone, whatever the SKU: after Redis lost the
-- claims pinning keys to their first SKU, a first-looking use of a key is
-- checked here before it is accepted.
CREATE INDEX reservations_by_idempotency_hash ON reservations (idempotency_hash)
    WHERE idempotency_hash IS NOT NULL;

-- Reservations with an idempotency key by creation: after such a loss, until
-- when new-looking claims must be checked is the newest use plus the TTL.
CREATE INDEX reservations_with_idempotency_by_created ON reservations (created_at)
    WHERE idempotency_hash IS NOT NULL;
