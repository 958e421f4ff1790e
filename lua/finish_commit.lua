-- finish_commit.lua: last step of a commit, after Postgres has the sale (or has
-- refused it). Marks the hold COMMITTED and moves its units from held to sold,
-- or puts it back.
--
-- KEYS[1]  {p}hold:<token>
-- ARGV[1]  partition base   ARGV[2] token   ARGV[3] outcome   ARGV[4] retention seconds
-- ARGV[5]  sku   ARGV[6] principal   ARGV[7] quantity   ARGV[8] committed_ms (from Postgres)
-- ARGV[9]  the attempt id (cst) begin_commit.lua gave; RESTORE and REFUSED need it
--
-- outcome is one of:
--   COMMITTED  Postgres has the sale: make Redis agree, whatever state the hold is in.
--   RESTORE    the sale certainly did not reach Postgres: COMMITTING goes back to HELD
--              with its original expiry (the sweeper expires it at once if that has
--              passed), but only while the hold still carries this attempt's id.
--   REFUSED    Postgres refused the sale (it would exceed the total): release the units,
--              under the same condition.
--   CANCELLED, EXPIRED  the ledger has the reservation as finished (its cancel or expiry
--              reached Postgres after Redis was rebuilt without it), so no attempt can
--              sell it: a COMMITTING or HELD hold is released with that status, whatever
--              attempt is on it.
-- When another attempt has joined since (the id changed), RESTORE and REFUSED change
-- nothing: that attempt, or the commit reconciler, settles the hold.
--
-- Returns hold_reply('OK', ...) (replayed = 1 when nothing changed), {'NOT_FOUND'}
-- when a RESTORE or REFUSED finds no live hold, or {'NEEDS_HYDRATION', sku} when the
-- SKU itself is gone from Redis (rebuilding from Postgres then includes this sale).
--
-- Why one script: the status change and the counter moves must land together,
-- or a crash between them would leave units counted twice or not at all.

local base, token, outcome = ARGV[1], ARGV[2], ARGV[3]
local retention = tonumber(ARGV[4])
local sku, who, qty = ARGV[5], ARGV[6], tonumber(ARGV[7])
local now = now_ms()

local gen = sku_gen(base, sku)
if not gen then
  return { 'NEEDS_HYDRATION', sku }
end
local h = hash_get(KEYS[1])
if not h or h['gen'] ~= gen then
  if outcome ~= 'COMMITTED' then
    redis.call('ZREM', base .. 'committing', token)
    return { 'NOT_FOUND' }
  end
  -- The SKU was rebuilt from Postgres before this sale reached it, and the
  -- rebuild did not know the hold. Record the sale now.
  h = { sku = sku, who = who, qty = tostring(qty), st = 'HELD_LOST', exp = h and h['exp'] or '0',
    ctd = h and h['ctd'] or tostring(now), gen = gen }
end

local st = h['st']
if outcome == 'COMMITTED' then
  if st == 'COMMITTED' then
    return hold_reply('OK', token, h, 1)
  end
  local d_avail, d_held = 0, -qty
  if st == 'CANCELLED' or st == 'EXPIRED' or st == 'HELD_LOST' then
    -- The units were already back in stock (or never counted as held): take
    -- them again. Postgres accepted the sale, so it is within the total, but
    -- Redis may meanwhile have promised those units to newer holds: then
    -- avail goes below zero, no reserve succeeds, and the excess hold is
    -- refused by Postgres when it commits (or expires), which brings avail
    -- back to zero. held + sold + avail == total holds throughout.
    d_avail, d_held = -qty, 0
    -- A released or unknown hold is not on the principal's count: count it.
    redis.call('HINCRBY', base .. 'quota:' .. sku, who, qty)
  end
  h['st'] = 'COMMITTED'
  h['cmt'] = ARGV[8]
  redis.call('HSET', KEYS[1], 'sku', sku, 'who', who, 'qty', tostring(qty), 'st', 'COMMITTED',
    'cmt', ARGV[8], 'exp', h['exp'], 'ctd', h['ctd'], 'gen', gen)
  redis.call('EXPIRE', KEYS[1], retention)
  redis.call('ZREM', base .. 'expiry', token)
  redis.call('ZREM', base .. 'committing', token)
  bump_stock(base, sku, d_avail, d_held, qty, now)
  emit(base, 'commit', token, h, now)
  announce(base, sku)
  return hold_reply('OK', token, h, 0)
end

if outcome == 'CANCELLED' or outcome == 'EXPIRED' then
  if st == 'COMMITTING' or st == 'HELD' then
    release(base, token, h, outcome, now, retention)
    return hold_reply('OK', token, h, 0)
  end
  redis.call('ZREM', base .. 'committing', token)
  return hold_reply('OK', token, h, 1)
end
if st ~= 'COMMITTING' then
  -- Someone else finished or released it meanwhile; nothing to undo.
  redis.call('ZREM', base .. 'committing', token)
  return hold_reply('OK', token, h, 1)
end
if h['cst'] ~= ARGV[9] then
  -- Another attempt joined: it may be writing the sale right now.
  return hold_reply('OK', token, h, 1)
end
if outcome == 'RESTORE' then
  redis.call('HSET', KEYS[1], 'st', 'HELD')
  redis.call('HDEL', KEYS[1], 'cst', 'cmv')
  redis.call('ZREM', base .. 'committing', token)
  redis.call('ZADD', base .. 'expiry', h['exp'], token)
  h['st'] = 'HELD'
  return hold_reply('OK', token, h, 0)
end
-- REFUSED
release(base, token, h, 'CANCELLED', now, retention)
return hold_reply('OK', token, h, 0)
