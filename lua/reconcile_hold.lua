-- reconcile_hold.lua: make Redis agree with what the ledger says of one hold
-- that Redis may not know as the ledger does: its SKU was rebuilt from a
-- ledger that did not have the hold's latest event yet (the event was on its
-- way through the write-behind when Redis lost its data), or the ledger has a
-- hold as HELD past its expiry that Redis does not have.
--
-- KEYS[1]  {p}hold:<token>
-- KEYS[2]  {p}sku:<sku>
-- KEYS[3]  {p}quota:<sku>
-- KEYS[4]  {p}expiry        HELD tokens by expiry (ms)
-- KEYS[5]  {p}committing    COMMITTING tokens by start (ms)
-- KEYS[6]  {p}outbox        the partition's event stream
-- KEYS[7]  {p}avail:<sku>   the SKU's announce channel
-- KEYS[8]  {p}wait:<sku>    KEYS[9] {p}waiters:<sku>   the SKU's waitlist
-- KEYS[10] {p}idem:<hash>   the hold's idempotency record (a placeholder key when there is none)
-- ARGV[1]  token   ARGV[2] the ledger's status (HELD, CANCELLED or EXPIRED)
-- ARGV[3]  sku   ARGV[4] principal   ARGV[5] quantity   ARGV[6] expires_ms   ARGV[7] created_ms
-- ARGV[8]  idempotency hash ("" when none)   ARGV[9] request fingerprint ("" when none)
-- ARGV[10] retention seconds for a finished hold   ARGV[11] idempotency TTL seconds
-- ARGV[12] how many times the hold was extended (its expiry is ARGV[6] already)
-- ARGV[13] partition base, for the holds handed to waiters (derived from the
--          tokens made here)   ARGV[14] nonce for those tokens (offer_token)
-- ARGV[15] '1' when the ledger's HELD row is marked dropped (dropped_at: a
--          rebuild recorded the hold as expired, its expiry is on its way to
--          the ledger, which refuses its sale as EXPIRED); '' otherwise
--
-- Returns {code}, with code as below. "Live" means the hold hash carries the
-- SKU's current generation.
--   ledger CANCELLED/EXPIRED, live HELD        released with the ledger's status, the
--                                              units to the SKU's waiters first
--                                              (handoff in lib.lua)               -> RELEASED
--   ledger CANCELLED/EXPIRED, live ended the other way (EXPIRED/CANCELLED)
--                                              its status set to the ledger's, nothing else:
--                                              both endings gave the units back once, and
--                                              the ledger keeps the first it was told of
--                                              (a cancel it recorded after the rebuild, or
--                                              the sweeper, had expired the hold) -> RESTATED
--   ledger CANCELLED/EXPIRED, anything else    nothing (a COMMITTING hold is settled by its
--                                              commit, which the ledger refuses)  -> AGREES
--   ledger HELD marked dropped, live HELD       released as EXPIRED (an expire event), the
--                                              units to the SKU's waiters first   -> RELEASED
--   ledger HELD, live in any other state        nothing (Redis knows it; any event
--                                              that ends it is on its way)        -> AGREES
--                when live CANCELLED or EXPIRED, the reply is {AGREES, status, ended_ms,
--                expires_ms, extensions}: the caller may repair the ledger from it if
--                the ending's event was lost (the overdue pass does)
--   ledger HELD, not live, not marked dropped, before its expiry, the stock and the quota
--                have room, and its idempotency key (if any) is free or points at it
--                                              adopted as HELD in this generation -> ADOPTED
--   ledger HELD, not live, otherwise            recorded EXPIRED here and in the ledger
--                                              (an expire event)                  -> CLOSED
--                the reply is {CLOSED, 'EXPIRED', ended_ms, expires_ms, extensions}
-- A row marked dropped is one a rebuild recorded as expired: the ledger refuses its
-- sale, so Redis must not count it as held again, whatever brought it back (its record
-- lost and read back from the ledger, or a promoted Redis that never saw that rebuild).
-- As a rebuild that finds the row still HELD and marked does, this drops it again.
-- or {'NEEDS_HYDRATION', sku} when the SKU is not loaded (a rebuild reads the ledger).
--
-- Why one script: the check of the hold, the stock and the quota and the
-- writes must be one step, or a reserve could take the units the adopted
-- hold is counted in. It checks everything before its first write, and is
-- idempotent: a second run finds the hold live and answers AGREES.

local token, status = ARGV[1], ARGV[2]
local sku, who, qty = ARGV[3], ARGV[4], tonumber(ARGV[5])
local k = { hold = KEYS[1], sku = KEYS[2], quota = KEYS[3], expiry = KEYS[4], committing = KEYS[5],
  outbox = KEYS[6], channel = KEYS[7], queue = KEYS[8], entries = KEYS[9] }
local gen = sku_gen(k.sku)
if not gen then
  return { 'NEEDS_HYDRATION', sku }
end
local h = hash_get(KEYS[1])
local live = h ~= nil and h['gen'] == gen
local now = now_ms()
local retention = tonumber(ARGV[10])
local dropped = status == 'HELD' and ARGV[15] == '1'

if status == 'CANCELLED' or status == 'EXPIRED' then
  if live and h['st'] == 'HELD' then
    release(k, token, h, status, now, retention)
    handoff(k, ARGV[13], sku, ARGV[14], now, h['who'])
    return { 'RELEASED' }
  end
  if live and h['st'] ~= status and (h['st'] == 'CANCELLED' or h['st'] == 'EXPIRED') then
    -- The ledger never changes an ending, so Redis takes its word: no
    -- stock moves and no event is written (the ledger has it).
    redis.call('HSET', KEYS[1], 'st', status)
    return { 'RESTATED' }
  end
  return { 'AGREES' }
end
if live then
  if dropped and h['st'] == 'HELD' then
    release(k, token, h, 'EXPIRED', now, retention)
    handoff(k, ARGV[13], sku, ARGV[14], now, h['who'])
    return { 'RELEASED' }
  end
  if h['st'] == 'CANCELLED' or h['st'] == 'EXPIRED' then
    return { 'AGREES', h['st'], tonumber(h['end'] or '0'), tonumber(h['exp']), tonumber(h['ext'] or '0') }
  end
  return { 'AGREES' }
end

local idem, fp = ARGV[8], ARGV[9]
local idem_rec = KEYS[10]
local rec = idem ~= '' and hash_get(idem_rec) or nil
local exp = tonumber(ARGV[6])
local fits = not dropped and now < exp and (rec == nil or (rec['code'] == 'OK' and rec['tok'] == token))
if fits then
  local s = redis.call('HMGET', k.sku, 'avail', 'max')
  local already = tonumber(redis.call('HGET', k.quota, who) or '0')
  local max = tonumber(s[2] or '0')
  fits = tonumber(s[1]) >= qty and (max == 0 or already + qty <= max)
end

local ext = ARGV[12] or '0'
h = { sku = sku, who = who, qty = ARGV[5], exp = ARGV[6], ctd = ARGV[7], idem = idem, fp = fp, gen = gen, ext = ext }
redis.call('DEL', KEYS[1])
redis.call('ZREM', k.expiry, token)
if fits then
  redis.call('HSET', KEYS[1], 'sku', sku, 'who', who, 'qty', ARGV[5], 'st', 'HELD', 'exp', ARGV[6],
    'ctd', ARGV[7], 'idem', idem, 'fp', fp, 'gen', gen, 'ext', ext)
  redis.call('HINCRBY', k.quota, who, qty)
  redis.call('ZADD', k.expiry, ARGV[6], token)
  bump_stock(k.sku, -qty, qty, 0, now)
else
  h['st'] = 'EXPIRED'
  h['end'] = tostring(now)
  redis.call('HSET', KEYS[1], 'sku', sku, 'who', who, 'qty', ARGV[5], 'st', 'EXPIRED', 'exp', ARGV[6],
    'ctd', ARGV[7], 'end', h['end'], 'idem', idem, 'fp', fp, 'gen', gen, 'ext', ext)
  redis.call('EXPIRE', KEYS[1], retention)
  emit(k.outbox, 'expire', token, h, now)
end
if idem ~= '' and rec == nil then
  -- The key replays this hold for what is left of its TTL.
  local left = tonumber(ARGV[11]) - math.floor((now - tonumber(ARGV[7])) / 1000)
  if left > 0 then
    redis.call('HSET', idem_rec, 'fp', fp, 'code', 'OK', 'tok', token)
    redis.call('EXPIRE', idem_rec, left)
  end
end
if fits then
  announce(k.sku, k.channel, sku)
  return { 'ADOPTED' }
end
return { 'CLOSED', 'EXPIRED', now, exp, tonumber(ext) }
