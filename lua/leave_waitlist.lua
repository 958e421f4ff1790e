-- leave_waitlist.lua: take a principal out of a SKU's waitlist.
--
-- KEYS[1]  {p}sku:<sku>       KEYS[2] {p}quota:<sku> (unused; waitlistKeys' order)
-- KEYS[3]  {p}wait:<sku>      KEYS[4] {p}waiters:<sku>
-- KEYS[5]  {p}expiry (unused) KEYS[6] {p}outbox   KEYS[7] {p}avail:<sku>
-- ARGV[1]  sku   ARGV[2] principal
--
-- Returns wait_reply('OK', ...) with status L: replayed 0 when the entry was
-- removed now (the reply carries it), 1 when there was none (left before, or never joined);
-- {'NEEDS_HYDRATION', sku} when the SKU is not loaded. Leaving an OFFERED
-- entry ends the entry only: the reservation it was handed is the
-- principal's, to commit or cancel.
--
-- Why one script: the removal and its event must be one step, so the ledger
-- records exactly the leaves that happened.

local sku, who = ARGV[1], ARGV[2]
if not redis.call('HGET', KEYS[1], 'gen') then
  return { 'NEEDS_HYDRATION', sku }
end
local e = wait_entry(redis.call('HGET', KEYS[4], who))
if not e then
  return wait_reply('OK', KEYS[3], sku, who, nil, 1)
end
local now = now_ms()
redis.call('HDEL', KEYS[4], who)
redis.call('ZREM', KEYS[3], who)
emit_wait(KEYS[6], 'wleave', sku, who, e, now)
bump_stock(KEYS[1], 0, 0, 0, now)
announce(KEYS[1], KEYS[7], sku)
e.st = 'L'
return wait_reply('OK', KEYS[3], sku, who, e, 0)
