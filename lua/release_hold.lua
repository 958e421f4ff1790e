-- release_hold.lua: give a hold's units back. Cancel and expiry both call it,
-- and it is idempotent: releasing twice restocks once.
--
-- KEYS[1]  {p}hold:<token>
-- KEYS[2]  {p}expiry       HELD tokens by expiry (ms)
-- KEYS[3]  {p}committing   COMMITTING tokens by start (ms)
-- KEYS[4]  {p}outbox       the partition's event stream
-- ARGV[1]  partition base, for the keys derived here: the caller (a cancel, the
--          sweeper) knows the hold by token only, so its SKU's stock hash, quota
--          hash and channel are built from the SKU read from KEYS[1] (sku_keys)
-- ARGV[2]  token   ARGV[3] principal ("" for the sweeper)
-- ARGV[4]  "1" when the caller is an admin   ARGV[5] CANCELLED or EXPIRED
-- ARGV[6]  retention seconds for the finished hold
-- ARGV[7]  nonce: random characters for the tokens of the holds the freed units
--          are handed over as (offer_token in lib.lua)
-- ARGV[8]  rejection TTL seconds: how long a provisional hold (a line of a cart
--          that never held) keeps its hash, as long as a refused reserve's record
--
-- The freed units go to the SKU's waiters first (handoff in lib.lua): their
-- queue and entries are derived from the SKU too (wait_keys), and so are the
-- holds handed over, from the tokens this script makes.
--
-- Returns hold_reply(code, ...) with code:
--   OK                 released now (replayed = 0) or released before (replayed = 1)
--   FORBIDDEN          a cancel by someone who neither holds it nor is an admin
--   ALREADY_COMMITTED  the hold is sold: nothing to release
--   COMMIT_IN_PROGRESS a commit is under way (or being settled): try again shortly
--   NOT_DUE            an expiry before the hold's expiresAt (left alone)
-- or {'NOT_FOUND'} when Redis has no such live hold (an expiry also drops the
-- token from the expiry index, so a lost hold cannot block the sweeper),
-- or {'NEEDS_HYDRATION', sku} when the hold's SKU is not loaded.
--
-- Why one script: the status check and the restock must be one step, or a
-- cancel racing the sweeper would restock the same units twice; and the
-- handoff must be the same step, or a reserve could take a freed unit before
-- the waiter it belongs to.

local base, token, who, admin, status = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local h = hash_get(KEYS[1])
local k = h and sku_keys(base, h['sku'])
local gen = h and sku_gen(k.sku)
if h and not gen then
  return { 'NEEDS_HYDRATION', h['sku'] }
end
if not h or h['gen'] ~= gen then
  if status == 'EXPIRED' then
    redis.call('ZREM', KEYS[2], token)
  end
  return { 'NOT_FOUND' }
end
if status == 'CANCELLED' and h['who'] ~= who and admin ~= '1' then
  return hold_reply('FORBIDDEN', token, h, 0)
end
local st = h['st']
if st == 'CANCELLED' or st == 'EXPIRED' then
  return hold_reply('OK', token, h, 1)
end
if st == 'COMMITTED' then
  return hold_reply('ALREADY_COMMITTED', token, h, 1)
end
if st == 'COMMITTING' then
  -- A commit is writing the sale, or its outcome is being settled: neither
  -- cancel nor expiry may touch it until then.
  return hold_reply('COMMIT_IN_PROGRESS', token, h, 1)
end
local now = now_ms()
if status == 'EXPIRED' and now < tonumber(h['exp']) then
  return hold_reply('NOT_DUE', token, h, 0)
end
if now >= tonumber(h['exp']) then
  -- A cancel that arrives after expiresAt records what really happened.
  status = 'EXPIRED'
end
k.hold, k.expiry, k.committing, k.outbox = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
release(k, token, h, status, now, tonumber(h['prov'] == '1' and ARGV[8] or ARGV[6]))
local w = wait_keys(base, h['sku'])
k.queue, k.entries = w.queue, w.entries
handoff(k, base, h['sku'], ARGV[7], now, h['who'])
return hold_reply('OK', token, h, 0)
