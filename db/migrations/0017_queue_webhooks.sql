-- The admission queue's webhook events, written by the ledger write that
-- records them, like every other event (0014):
--   queue.opened: the queue opened and its pre-queue was numbered
--     (pre_queue_size set, once); the seed is revealed with it, so a
--     receiver can recompute the pre-queue's order (`dropline verify-queue`).
--   queue.admitted: admission moved forward (admitted_through grew); numbers
--     from..through may now buy, each with its own pass. A replayed batch
--     leaves admitted_through as it was and sends nothing.
-- A product's queue is ordered with the product's other events (its sku);
-- a drop's queue by its own id ("drop:<id>").
CREATE FUNCTION webhook_queue_data(q queues) RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object('queue', q.id, 'sku', q.sku, 'drop', q.drop_id)
$$;

CREATE FUNCTION webhook_queue_opened() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM webhook_emit('queue.opened', coalesce(NEW.sku, NEW.id), now(), webhook_queue_data(NEW) || jsonb_build_object(
        'preQueueSize', NEW.pre_queue_size, 'seed', encode(NEW.seed, 'hex'), 'seedHash', NEW.seed_hash,
        'opensAt', webhook_time(NEW.opens_at)));
    RETURN NULL;
END;
$$;

CREATE TRIGGER webhook_queue_opened AFTER UPDATE OF pre_queue_size ON queues
    FOR EACH ROW WHEN (OLD.pre_queue_size IS NULL AND NEW.pre_queue_size IS NOT NULL)
    EXECUTE FUNCTION webhook_queue_opened();

CREATE FUNCTION webhook_queue_admitted() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM webhook_emit('queue.admitted', coalesce(NEW.sku, NEW.id), now(), webhook_queue_data(NEW) || jsonb_build_object(
        'from', OLD.admitted_through + 1, 'through', NEW.admitted_through));
    RETURN NULL;
END;
$$;

CREATE TRIGGER webhook_queue_admitted AFTER UPDATE OF admitted_through ON queues
    FOR EACH ROW WHEN (NEW.admitted_through > OLD.admitted_through)
    EXECUTE FUNCTION webhook_queue_admitted();
