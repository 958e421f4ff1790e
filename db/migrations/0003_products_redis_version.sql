-- redis_version is the newest product version known to have reached Redis.
-- A product write commits here first and is then applied to Redis; when that
-- second step fails (Redis unreachable, a timeout), redis_version stays below
-- version, and the commit reconciler re-applies the product from this row
-- (version-guarded, so a late or repeated apply changes nothing newer). Rows
-- that existed before this column are checked once.
ALTER TABLE products ADD COLUMN redis_version bigint NOT NULL DEFAULT 0;

CREATE INDEX products_behind_in_redis ON products (sku) WHERE redis_version < version;
