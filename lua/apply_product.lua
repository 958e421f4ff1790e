-- apply_product.lua: bring a SKU's product settings and total up to a newer
-- Postgres version (after a restock or a product update).
--
-- KEYS[1]  {p}sku:<sku>
-- KEYS[2]  {p}avail:<sku>   the SKU's announce channel
-- KEYS[3]  {p}quota:<sku>   KEYS[4] {p}expiry   KEYS[5] {p}outbox
-- KEYS[6]  {p}wait:<sku>    KEYS[7] {p}waiters:<sku>   the SKU's waitlist
-- ARGV[1]  sku   ARGV[2] version   ARGV[3] total
-- ARGV[4]  max per user (0 = none)   ARGV[5] sale start ms (0 = none)   ARGV[6] sale end ms (0 = none)
-- ARGV[7]  partition base, for the holds handed to waiters (derived from the
--          tokens made here)   ARGV[8] nonce for those tokens (offer_token)
--
-- Units a restock adds (or a wider limit or window lets waiters take) go to
-- the SKU's waiters first (handoff in lib.lua).
--
-- Returns {'OK'}, {'STALE'} when Redis already has this version or a newer one
-- (an older write never overwrites a newer one), or {'NEEDS_HYDRATION'} when
-- the SKU is not in Redis (the caller rebuilds it and runs this again, STALE when
-- the rebuild read this version).
--
-- Why one script: available is derived (total - held - sold) from counters that
-- reserves change concurrently; computing and writing it must be one step, and
-- handing the new units to waiters the same step, before any reserve.

local sku = ARGV[1]
local s = redis.call('HMGET', KEYS[1], 'ver', 'held', 'sold', 'gen')
if not s[4] then
  return { 'NEEDS_HYDRATION' }
end
if tonumber(s[1]) >= tonumber(ARGV[2]) then
  return { 'STALE' }
end
-- May be below zero after Redis lost state mid-commit (see finish_commit.lua);
-- it must stay exact so that avail + held + sold == total.
local avail = tonumber(ARGV[3]) - tonumber(s[2]) - tonumber(s[3])
local now = now_ms()
redis.call('HSET', KEYS[1], 'ver', ARGV[2], 'total', ARGV[3], 'avail', avail,
  'max', ARGV[4], 'start', ARGV[5], 'end', ARGV[6])
bump_stock(KEYS[1], 0, 0, 0, now)
announce(KEYS[1], KEYS[2], sku)
handoff({ sku = KEYS[1], channel = KEYS[2], quota = KEYS[3], expiry = KEYS[4], outbox = KEYS[5],
  queue = KEYS[6], entries = KEYS[7] }, ARGV[7], sku, ARGV[8], now)
return { 'OK' }
