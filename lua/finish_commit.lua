-- finish_commit.lua: last step of a commit, after Postgres has the sale (or has
-- refused it). Marks the hold COMMITTED and moves its units from held to sold,
-- or puts it back.
--
-- KEYS[1]  {p}hold:<token>
-- KEYS[2]  {p}sku:<sku>     the hold's SKU (the caller has it from begin_commit.lua or the hold)
-- KEYS[3]  {p}quota:<sku>
-- KEYS[4]  {p}expiry        HELD tokens by expiry (ms)
-- KEYS[5]  {p}committing    COMMITTING tokens by start (ms)
-- KEYS[6]  {p}outbox        the partition's event stream
-- KEYS[7]  {p}avail:<sku>   the SKU's announce channel
-- KEYS[8]  {p}wait:<sku>    KEYS[9] {p}waiters:<sku>   the SKU's waitlist
-- ARGV[1]  token   ARGV[2] outcome   ARGV[3] retention seconds
-- ARGV[4]  sku   ARGV[5] principal   ARGV[6] quantity   ARGV[7] committed_ms (from Postgres)
-- ARGV[8]  the attempt id (cst) begin_commit.lua gave; RESTORE and REFUSED need it
-- ARGV[9]  partition base, for the holds handed to waiters (derived from the
--          tokens made here)   ARGV[10] nonce for those tokens (offer_token);
--          only an outcome that can release needs them
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
-- nothing: that attempt, or the commit reconciler, settles the hold. Units released
-- here go to the SKU's waiters first (handoff in lib.lua), as a cancel's or an
-- expiry's do: they are freed all the same.
--
-- Returns hold_reply('OK', ...) (replayed = 1 when nothing changed), {'NOT_FOUND'}
-- when a RESTORE or REFUSED finds no live hold, or {'NEEDS_HYDRATION', sku} when the
-- SKU itself is gone from Redis (the caller rebuilds it and runs this again: a
-- rebuild whose snapshot lost its lock before its publish may not have the sale).
--
-- Why one script: the status change and the counter moves must land together,
-- or a crash between them would leave units counted twice or not at all.

local token, outcome = ARGV[1], ARGV[2]
local retention = tonumber(ARGV[3])
local sku, who, qty = ARGV[4], ARGV[5], tonumber(ARGV[6])
local k = { hold = KEYS[1], sku = KEYS[2], quota = KEYS[3], expiry = KEYS[4], committing = KEYS[5],
  outbox = KEYS[6], channel = KEYS[7], queue = KEYS[8], entries = KEYS[9] }
local now = now_ms()

local gen = sku_gen(k.sku)
if not gen then
  return { 'NEEDS_HYDRATION', sku }
end
local h = hash_get(KEYS[1])
if not h or h['gen'] ~= gen then
  if outcome ~= 'COMMITTED' then
    redis.call('ZREM', k.committing, token)
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
    redis.call('HINCRBY', k.quota, who, qty)
  end
  h['st'] = 'COMMITTED'
  h['cmt'] = ARGV[7]
  redis.call('HSET', KEYS[1], 'sku', sku, 'who', who, 'qty', tostring(qty), 'st', 'COMMITTED',
    'cmt', ARGV[7], 'exp', h['exp'], 'ctd', h['ctd'], 'gen', gen)
  redis.call('EXPIRE', KEYS[1], retention)
  redis.call('ZREM', k.expiry, token)
  redis.call('ZREM', k.committing, token)
  bump_stock(k.sku, d_avail, d_held, qty, now)
  emit(k.outbox, 'commit', token, h, now)
  announce(k.sku, k.channel, sku)
  return hold_reply('OK', token, h, 0)
end

if outcome == 'CANCELLED' or outcome == 'EXPIRED' then
  if st == 'COMMITTING' or st == 'HELD' then
    release(k, token, h, outcome, now, retention)
    handoff(k, ARGV[9], sku, ARGV[10], now, h['who'])
    return hold_reply('OK', token, h, 0)
  end
  redis.call('ZREM', k.committing, token)
  return hold_reply('OK', token, h, 1)
end
if st ~= 'COMMITTING' then
  -- Someone else finished or released it meanwhile; nothing to undo.
  redis.call('ZREM', k.committing, token)
  return hold_reply('OK', token, h, 1)
end
if h['cst'] ~= ARGV[8] then
  -- Another attempt joined: it may be writing the sale right now.
  return hold_reply('OK', token, h, 1)
end
if outcome == 'RESTORE' then
  redis.call('HSET', KEYS[1], 'st', 'HELD')
  redis.call('HDEL', KEYS[1], 'cst', 'cmv')
  redis.call('ZREM', k.committing, token)
  redis.call('ZADD', k.expiry, h['exp'], token)
  h['st'] = 'HELD'
  return hold_reply('OK', token, h, 0)
end
-- REFUSED
release(k, token, h, 'CANCELLED', now, retention)
handoff(k, ARGV[9], sku, ARGV[10], now, h['who'])
return hold_reply('OK', token, h, 0)
