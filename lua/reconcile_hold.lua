-- reconcile_hold.lua: make Redis agree with what the ledger says of one hold
-- that Redis may not know as the ledger does: its SKU was rebuilt from a
-- ledger that did not have the hold's latest event yet (the event was on its
-- way through the write-behind when Redis lost its data), or the ledger has a
-- hold as HELD past its expiry that Redis does not have.
--
-- KEYS[1]  {p}hold:<token>
-- ARGV[1]  partition base   ARGV[2] token   ARGV[3] the ledger's status (HELD, CANCELLED or EXPIRED)
-- ARGV[4]  sku   ARGV[5] principal   ARGV[6] quantity   ARGV[7] expires_ms   ARGV[8] created_ms
-- ARGV[9]  idempotency hash ("" when none)   ARGV[10] request fingerprint ("" when none)
-- ARGV[11] retention seconds for a finished hold   ARGV[12] idempotency TTL seconds
--
-- Returns {code}, with code as below. "Live" means the hold hash carries the
-- SKU's current generation.
--   ledger CANCELLED/EXPIRED, live HELD        released with the ledger's status -> RELEASED
--   ledger CANCELLED/EXPIRED, anything else    nothing (a COMMITTING hold is settled by its
--                                              commit, which the ledger refuses)  -> AGREES
--   ledger HELD, live in any state              nothing (Redis knows it; any event
--                                              that ends it is on its way)        -> AGREES
--   ledger HELD, not live, before its expiry, the stock and the quota have room, and its
--                idempotency key (if any) is free or points at it
--                                              adopted as HELD in this generation -> ADOPTED
--   ledger HELD, not live, otherwise            recorded EXPIRED here and in the ledger
--                                              (an expire event)                  -> CLOSED
-- or {'NEEDS_HYDRATION', sku} when the SKU is not loaded (a rebuild reads the ledger).
--
-- Why one script: the check of the hold, the stock and the quota and the
-- writes must be one step, or a reserve could take the units the adopted
-- hold is counted in. It checks everything before its first write, and is
-- idempotent: a second run finds the hold live and answers AGREES.

local base, token, status = ARGV[1], ARGV[2], ARGV[3]
local sku, who, qty = ARGV[4], ARGV[5], tonumber(ARGV[6])
local gen = sku_gen(base, sku)
if not gen then
  return { 'NEEDS_HYDRATION', sku }
end
local h = hash_get(KEYS[1])
local live = h ~= nil and h['gen'] == gen
local now = now_ms()
local retention = tonumber(ARGV[11])

if status == 'CANCELLED' or status == 'EXPIRED' then
  if live and h['st'] == 'HELD' then
    release(base, token, h, status, now, retention)
    return { 'RELEASED' }
  end
  return { 'AGREES' }
end
if live then
  return { 'AGREES' }
end

local idem, fp = ARGV[9], ARGV[10]
local idem_key = base .. 'idem:' .. idem
local rec = idem ~= '' and hash_get(idem_key) or nil
local exp = tonumber(ARGV[7])
local fits = now < exp and (rec == nil or (rec['code'] == 'OK' and rec['tok'] == token))
local quota_key = base .. 'quota:' .. sku
if fits then
  local s = redis.call('HMGET', base .. 'sku:' .. sku, 'avail', 'max')
  local already = tonumber(redis.call('HGET', quota_key, who) or '0')
  local max = tonumber(s[2] or '0')
  fits = tonumber(s[1]) >= qty and (max == 0 or already + qty <= max)
end

h = { sku = sku, who = who, qty = ARGV[6], exp = ARGV[7], ctd = ARGV[8], idem = idem, fp = fp, gen = gen }
redis.call('DEL', KEYS[1])
redis.call('ZREM', base .. 'expiry', token)
if fits then
  redis.call('HSET', KEYS[1], 'sku', sku, 'who', who, 'qty', ARGV[6], 'st', 'HELD', 'exp', ARGV[7],
    'ctd', ARGV[8], 'idem', idem, 'fp', fp, 'gen', gen)
  redis.call('HINCRBY', quota_key, who, qty)
  redis.call('ZADD', base .. 'expiry', ARGV[7], token)
  bump_stock(base, sku, -qty, qty, 0, now)
else
  h['st'] = 'EXPIRED'
  h['end'] = tostring(now)
  redis.call('HSET', KEYS[1], 'sku', sku, 'who', who, 'qty', ARGV[6], 'st', 'EXPIRED', 'exp', ARGV[7],
    'ctd', ARGV[8], 'end', h['end'], 'idem', idem, 'fp', fp, 'gen', gen)
  redis.call('EXPIRE', KEYS[1], retention)
  emit(base, 'expire', token, h, now)
end
if idem ~= '' and rec == nil then
  -- The key replays this hold for what is left of its TTL.
  local left = tonumber(ARGV[12]) - math.floor((now - tonumber(ARGV[8])) / 1000)
  if left > 0 then
    redis.call('HSET', idem_key, 'fp', fp, 'code', 'OK', 'tok', token)
    redis.call('EXPIRE', idem_key, left)
  end
end
if fits then
  announce(base, sku)
  return { 'ADOPTED' }
end
return { 'CLOSED' }
