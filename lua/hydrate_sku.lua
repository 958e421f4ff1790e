-- hydrate_sku.lua: rebuild one SKU in Redis from a Postgres snapshot, after
-- Redis lost it (restart, flush, failover) or never had it (a new product).
--
-- KEYS[1]  {p}sku:<sku>
-- ARGV[1]  partition base   ARGV[2] sku   ARGV[3] total   ARGV[4] sold
-- ARGV[5]  max per user (0 = none)   ARGV[6] sale start ms (0 = none)   ARGV[7] sale end ms (0 = none)
-- ARGV[8]  product version   ARGV[9] retention seconds   ARGV[10] idempotency TTL seconds
-- ARGV[11] held   ARGV[12] available
-- ARGV[13] number of holds H, then H groups of 10 (status: see below):
--          token, principal, quantity, status, expires_ms, created_ms, committed_ms, ended_ms,
--          idempotency hash, request fingerprint
-- then     number of principals U, then U pairs: principal, units held or bought
--
-- A hold's status is HELD, COMMITTED, CANCELLED or EXPIRED as Postgres has it
-- (finished ones are restored so their idempotency key replays them), or DROP:
-- one Postgres still had as HELD that is past due or no longer fits the stock,
-- which the script records as EXPIRED, emitting its expire event.
--
-- Returns {'OK'} after writing, or {'EXISTS'} when the SKU is already loaded
-- (another caller rebuilt it first; nothing is written). The rebuilt SKU and
-- its restored holds get a new generation (see sku_gen in lib.lua).
--
-- Why one script: a reader must see either no SKU (and rebuild) or all of it,
-- never counters without their holds. The caller holds the Postgres row lock
-- of the product while this runs, so no commit can slip between the snapshot
-- and this write.

local base, sku = ARGV[1], ARGV[2]
if redis.call('HEXISTS', KEYS[1], 'gen') == 1 then
  return { 'EXISTS' }
end
-- A new life of the SKU: holds of any earlier one no longer count.
redis.call('DEL', KEYS[1])
local gen = now_us()
local now = now_ms()
local retention, idem_ttl = tonumber(ARGV[9]), tonumber(ARGV[10])

local i = 14
for _ = 1, tonumber(ARGV[13]) do
  local token, st, exp = ARGV[i], ARGV[i + 3], ARGV[i + 4]
  local dropped = st == 'DROP'
  if dropped then
    st = 'EXPIRED'
  end
  local key = base .. 'hold:' .. token
  redis.call('DEL', key)
  redis.call('HSET', key, 'sku', sku, 'who', ARGV[i + 1], 'qty', ARGV[i + 2], 'st', st,
    'exp', exp, 'ctd', ARGV[i + 5], 'cmt', ARGV[i + 6], 'end', ARGV[i + 7],
    'idem', ARGV[i + 8], 'fp', ARGV[i + 9], 'gen', gen)
  if st == 'HELD' then
    redis.call('ZADD', base .. 'expiry', exp, token)
  else
    redis.call('EXPIRE', key, retention)
  end
  if dropped then
    -- Postgres still had this hold as HELD, but it is past its expiry or no
    -- longer fits the stock: record its release so the ledger closes it.
    emit(base, 'expire', token, { sku = sku, who = ARGV[i + 1], qty = ARGV[i + 2], exp = exp,
      ctd = ARGV[i + 5], idem = ARGV[i + 8], fp = ARGV[i + 9] }, now)
  end
  if ARGV[i + 8] ~= '' then
    -- The key replays for what is left of its TTL, counted from the reserve.
    local left = idem_ttl - math.floor((now - tonumber(ARGV[i + 5])) / 1000)
    if left > 0 then
      local idem_key = base .. 'idem:' .. ARGV[i + 8]
      redis.call('HSET', idem_key, 'fp', ARGV[i + 9], 'code', 'OK', 'tok', token)
      redis.call('EXPIRE', idem_key, left)
    end
  end
  i = i + 10
end

local users = tonumber(ARGV[i])
i = i + 1
for _ = 1, users do
  redis.call('SET', base .. 'user:' .. sku .. ':' .. ARGV[i], ARGV[i + 1])
  i = i + 2
end

redis.call('HSET', KEYS[1], 'total', ARGV[3], 'sold', ARGV[4], 'held', ARGV[11], 'avail', ARGV[12],
  'max', ARGV[5], 'start', ARGV[6], 'end', ARGV[7], 'ver', ARGV[8], 'seq', gen, 'upd', now, 'gen', gen)
announce(base, sku)
return { 'OK' }
