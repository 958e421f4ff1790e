-- hydrate_sku.lua: write one chunk of a SKU's rebuild from a Postgres
-- snapshot, after Redis lost the SKU (restart, flush, failover, eviction) or
-- never had it (a new product). stage_rebuild.lua comes first, publish_sku.lua
-- last; a chunk holds a few thousand reservations, so no script runs long.
--
-- KEYS[1]  {p}sku:<sku>            must still be absent
-- KEYS[2]  {p}rebuild:<sku>        the rebuild under way (gen, next)
-- KEYS[3]  {p}rebuild:<sku>:quota  the staged quota hash
-- KEYS[4]  {p}expiry               HELD tokens by expiry (ms)
-- KEYS[5]  {p}outbox               the partition's event stream
-- ARGV[1]  partition base, for the per-item keys of the chunk: each hold's hash and
--          idempotency record (up to RebuildBatch of each, named by the tokens and
--          hashes in the chunk; passing them all in KEYS would double the call)
-- ARGV[2]  sku   ARGV[3] generation (from stage_rebuild.lua)
-- ARGV[4]  this chunk's number, from 0   ARGV[5] retention seconds   ARGV[6] idempotency TTL seconds
-- ARGV[7]  seconds the staged keys live
-- ARGV[8]  number of holds H, then H groups of 11 (status: see below):
--          token, principal, quantity, status, expires_ms, created_ms, committed_ms, ended_ms,
--          idempotency hash, request fingerprint, extensions (how many times it was extended)
-- then     number of quota entries U, then U pairs: principal, units to add
--
-- A hold's status is HELD, COMMITTED, CANCELLED or EXPIRED as Postgres has it
-- (finished ones are restored so their idempotency key replays them), or DROP:
-- one Postgres still had as HELD that is past due or no longer fits the stock,
-- which the script records as EXPIRED, emitting its expire event.
--
-- Returns {'OK'} after writing; {'DONE'} when this chunk was written before
-- (a retried call: nothing is written twice); {'EXISTS'} when the SKU is
-- already loaded; {'STALE'} when a newer rebuild has staged since, or a chunk
-- is missing (nothing is written).
--
-- Why one script: the checks and the writes of a chunk must be one step, so
-- that a rebuild that lost the race can never write into the newer one. The
-- holds carry the new generation, and count only once publish_sku.lua gives
-- the SKU that generation: until then every reader finds no SKU and waits for
-- the rebuild. The caller holds the Postgres row lock of the product
-- throughout, so no commit can slip between the snapshot and these writes.

if redis.call('HEXISTS', KEYS[1], 'gen') == 1 then
  return { 'EXISTS' }
end
local r = redis.call('HMGET', KEYS[2], 'gen', 'next')
if r[1] ~= ARGV[3] then
  return { 'STALE' }
end
local seq, next = tonumber(ARGV[4]), tonumber(r[2])
if seq < next then
  return { 'DONE' }
end
if seq > next then
  return { 'STALE' }
end

local base, sku, gen = ARGV[1], ARGV[2], ARGV[3]
local now = now_ms()
local retention, idem_ttl = tonumber(ARGV[5]), tonumber(ARGV[6])
local i = 9
for _ = 1, tonumber(ARGV[8]) do
  local token, st, exp = ARGV[i], ARGV[i + 3], ARGV[i + 4]
  local dropped = st == 'DROP'
  if dropped then
    st = 'EXPIRED'
  end
  local key = hold_key(base, token)
  redis.call('DEL', key)
  redis.call('HSET', key, 'sku', sku, 'who', ARGV[i + 1], 'qty', ARGV[i + 2], 'st', st,
    'exp', exp, 'ctd', ARGV[i + 5], 'cmt', ARGV[i + 6], 'end', ARGV[i + 7],
    'idem', ARGV[i + 8], 'fp', ARGV[i + 9], 'gen', gen, 'ext', ARGV[i + 10])
  if st == 'HELD' then
    redis.call('ZADD', KEYS[4], exp, token)
    -- Bounded even if this rebuild loses: the sweeper ends a hold at its
    -- expiry, and releasing it sets the retention instead.
    redis.call('PEXPIREAT', key, tonumber(exp) + retention * 1000)
  else
    redis.call('EXPIRE', key, retention)
  end
  if dropped then
    -- Postgres still had this hold as HELD, but it is past its expiry or no
    -- longer fits the stock: record its release so the ledger closes it.
    emit(KEYS[5], 'expire', token, { sku = sku, who = ARGV[i + 1], qty = ARGV[i + 2], exp = exp,
      ctd = ARGV[i + 5], idem = ARGV[i + 8], fp = ARGV[i + 9], gen = gen, ext = ARGV[i + 10] }, now)
  end
  if ARGV[i + 8] ~= '' then
    -- The key replays for what is left of its TTL, counted from the reserve.
    local left = idem_ttl - math.floor((now - tonumber(ARGV[i + 5])) / 1000)
    if left > 0 then
      local rec = idem_key(base, ARGV[i + 8])
      redis.call('HSET', rec, 'fp', ARGV[i + 9], 'code', 'OK', 'tok', token)
      redis.call('EXPIRE', rec, left)
    end
  end
  i = i + 11
end

local users = tonumber(ARGV[i])
i = i + 1
for _ = 1, users do
  redis.call('HINCRBY', KEYS[3], ARGV[i], ARGV[i + 1])
  i = i + 2
end
if users > 0 then
  redis.call('EXPIRE', KEYS[3], ARGV[7])
end
redis.call('HINCRBY', KEYS[2], 'next', 1)
return { 'OK' }
