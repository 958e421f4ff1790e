-- apply_product.lua: bring a SKU's product settings and total up to a newer
-- Postgres version (after a restock or a product update).
--
-- KEYS[1]  {p}sku:<sku>
-- ARGV[1]  partition base   ARGV[2] sku   ARGV[3] version   ARGV[4] total
-- ARGV[5]  max per user (0 = none)   ARGV[6] sale start ms (0 = none)   ARGV[7] sale end ms (0 = none)
--
-- Returns {'OK'}, {'STALE'} when Redis already has this version or a newer one
-- (an older write never overwrites a newer one), or {'NEEDS_HYDRATION'} when
-- the SKU is not in Redis (the caller rebuilds it, which includes this change).
--
-- Why one script: available is derived (total - held - sold) from counters that
-- reserves change concurrently; computing and writing it must be one step.

local base, sku = ARGV[1], ARGV[2]
local s = redis.call('HMGET', KEYS[1], 'ver', 'held', 'sold', 'gen')
if not s[4] then
  return { 'NEEDS_HYDRATION' }
end
if tonumber(s[1]) >= tonumber(ARGV[3]) then
  return { 'STALE' }
end
-- May be below zero after Redis lost state mid-commit (see finish_commit.lua);
-- it must stay exact so that avail + held + sold == total.
local avail = tonumber(ARGV[4]) - tonumber(s[2]) - tonumber(s[3])
local now = now_ms()
redis.call('HSET', KEYS[1], 'ver', ARGV[3], 'total', ARGV[4], 'avail', avail,
  'max', ARGV[5], 'start', ARGV[6], 'end', ARGV[7])
bump_stock(base, sku, 0, 0, 0, now)
announce(base, sku)
return { 'OK' }
