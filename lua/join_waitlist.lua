-- join_waitlist.lua: put a principal in a SKU's waitlist, or replay its entry.
--
-- KEYS[1]  {p}sku:<sku>       KEYS[2] {p}quota:<sku>
-- KEYS[3]  {p}wait:<sku>      the queue: WAITING principals by seq
-- KEYS[4]  {p}waiters:<sku>   the entries by principal ('#seq': the last seq)
-- KEYS[5]  {p}expiry          KEYS[6] {p}outbox   KEYS[7] {p}avail:<sku>
-- ARGV[1]  partition base, for the holds handed over here (derived from the
--          tokens made here)
-- ARGV[2]  sku   ARGV[3] principal   ARGV[4] quantity   ARGV[5] hold ms
-- ARGV[6]  most WAITING entries the SKU may have   ARGV[7] nonce (offer_token)
-- ARGV[8]  max quantity per call   ARGV[9] min hold ms   ARGV[10] max hold ms
--
-- Returns wait_reply('OK', ...) (lib.lua) for a new entry (replayed 0) or the
-- principal's entry, WAITING or OFFERED, when it has one (replayed 1; the
-- quantity and hold asked this time are ignored), or a rejection
-- {code, a, b}: INVALID_INPUT {field, reason}, NEEDS_HYDRATION {sku},
-- SALE_NOT_ACTIVE {starts_ms, ends_ms}, QUOTA_EXCEEDED {limit, already} (the
-- quantity exceeds the per-principal limit: no offer could ever be made),
-- WAITLIST_FULL {limit}, DRAW_ONLY (a draw's waitlist is its losers, in draw order).
--
-- A new entry joins at the back; if units are available that no waiter ahead
-- can take and they fit, it is served at once (handoff in lib.lua), so a
-- join never leaves a waiter waiting for units that are there.
--
-- Why one script: the one-entry check, the length bound and the append must
-- be one step, or two joins could both take the last place, or one principal
-- get two entries; the handoff is the same step so the entry is served
-- exactly when its turn says.

local base, sku, who = ARGV[1], ARGV[2], ARGV[3]
local k = { sku = KEYS[1], quota = KEYS[2], queue = KEYS[3], entries = KEYS[4], expiry = KEYS[5],
  outbox = KEYS[6], channel = KEYS[7] }

if not is_int(ARGV[4], 1, tonumber(ARGV[8])) then
  return { 'INVALID_INPUT', 'quantity', 'must be between 1 and ' .. ARGV[8] }
end
if not is_int(ARGV[5], tonumber(ARGV[9]), tonumber(ARGV[10])) then
  return { 'INVALID_INPUT', 'holdSeconds', 'out of range' }
end
if sku == '' or who == '' or string.sub(who, 1, 1) == '#' then
  return { 'INVALID_INPUT', 'input', 'sku and principal are required' }
end
local s = redis.call('HMGET', k.sku, 'max', 'start', 'end', 'gen', 'draw')
if not s[4] then
  return { 'NEEDS_HYDRATION', sku }
end
if s[5] then
  return { 'DRAW_ONLY', '', '' }
end

local mine = wait_entry(redis.call('HGET', k.entries, who))
if mine then
  return wait_reply('OK', k.queue, sku, who, mine, 1)
end

local now = now_ms()
local max, starts, ends = tonumber(s[1] or '0'), tonumber(s[2] or '0'), tonumber(s[3] or '0')
if (starts > 0 and now < starts) or (ends > 0 and now >= ends) then
  return { 'SALE_NOT_ACTIVE', starts, ends }
end
local qty = tonumber(ARGV[4])
if max > 0 and qty > max then
  return { 'QUOTA_EXCEEDED', max, tonumber(redis.call('HGET', k.quota, who) or '0') }
end
if redis.call('ZCARD', k.queue) >= tonumber(ARGV[6]) then
  return { 'WAITLIST_FULL', ARGV[6], '' }
end

-- %d, not tostring: seqs start above a generation (16 digits), past %.14g.
local seq = string.format('%d', redis.call('HINCRBY', k.entries, '#seq', 1))
local e = { seq = seq, qty = qty, hold = tonumber(ARGV[5]), st = 'W', tok = '', joined = tostring(now) }
redis.call('HSET', k.entries, who, wait_encode(e))
redis.call('ZADD', k.queue, seq, who)
emit_wait(k.outbox, 'wjoin', sku, who, e, now)
-- Positions are pushed by the SKU's announcements: a waitlist change moves seq.
bump_stock(k.sku, 0, 0, 0, now)
announce(k.sku, k.channel, sku)
handoff(k, base, sku, ARGV[7], now)
return wait_reply('OK', k.queue, sku, who, wait_entry(redis.call('HGET', k.entries, who)), 0)
