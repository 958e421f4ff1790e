-- join_waitlist.lua: put a principal in a SKU's waitlist, or replay its entry.
--
-- KEYS[1]  {p}sku:<sku>       KEYS[2] {p}quota:<sku>
-- KEYS[3]  {p}wait:<sku>      the queue: WAITING principals by seq
-- KEYS[4]  {p}waiters:<sku>   the entries by principal ('#seq': the last seq)
-- KEYS[5]  {p}expiry          KEYS[6] {p}outbox   KEYS[7] {p}avail:<sku>
-- ARGV[1]  partition base, for the keys derived here: the holds handed over
--          (from the tokens made here), the partition's unfinished walks (walks_key),
--          and for a SKU of a drop, the drop's hash and the stock and quota hashes
--          of its SKUs (may_take in lib.lua)
-- ARGV[2]  sku   ARGV[3] principal   ARGV[4] quantity   ARGV[5] hold ms
-- ARGV[6]  most WAITING entries the SKU may have   ARGV[7] nonce (offer_token)
-- ARGV[8]  max quantity per call   ARGV[9] min hold ms   ARGV[10] max hold ms
-- ARGV[11] the admission pass presented ("" when none; only a queued SKU asks for one)
--
-- Returns wait_reply('OK', ...) (lib.lua) for a new entry (replayed 0) or the
-- principal's entry, WAITING or OFFERED, when it has one (replayed 1; the
-- quantity and hold asked this time are ignored), or a rejection
-- {code, a, b}: INVALID_INPUT {field, reason}, NEEDS_HYDRATION {sku} (that
-- SKU, a SKU of its drop or the drop is not loaded), SALE_NOT_ACTIVE
-- {starts_ms, ends_ms} (the SKU's or its drop's window), QUOTA_EXCEEDED
-- {limit, already} (what the principal holds or bought of the SKU, or of its
-- drop, plus the quantity asked is above the limit: no offer could be made),
-- WAITLIST_FULL {limit}, DRAW_ONLY (a draw's waitlist is its losers, in draw
-- order), QUEUE_REQUIRED, PASS_EXPIRED, PASS_INVALID (a queued SKU: joining
-- its waitlist takes the buyer's admission pass, and spends it).
--
-- A new entry is asked of may_take (lib.lua) on the 'join' path, the policy
-- every path that hands out units shares: the product's sale mode must admit
-- a join, then the sale window, the SKU's per-person limit and the drop's
-- window and limit, as an offer would be checked, but not the stock (units
-- that are not there are what a waiter waits for). A join the limits refuse
-- could never be offered anything while the principal keeps what it holds,
-- so it is not queued (a waiter that falls over a limit later, by buying
-- elsewhere, is passed over by every offer until it no longer does).
--
-- A new entry joins at the back; if units are available that no waiter ahead
-- can take and they fit, it is served at once (join_handoff in lib.lua), so
-- a join never leaves a waiter waiting for units that are there. While the
-- SKU's walk is unfinished the join takes it one run further instead, and
-- the new entry is served when the walk reaches it.
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
local s = redis.call('HMGET', k.sku, 'gen', 'max', 'start', 'end', 'drop', 'mode')
if not s[1] then
  return { 'NEEDS_HYDRATION', sku }
end

local mine = wait_entry(redis.call('HGET', k.entries, who))
if mine then
  return wait_reply('OK', k.queue, sku, who, mine, 1)
end

local now = now_ms()
local qty = tonumber(ARGV[4])
local view = sku_view(sku, s, 2, k.quota, 0)
view.pass = ARGV[11]
local no = may_take('join', base, view, who, qty, now)
if no then
  return no
end
if redis.call('ZCARD', k.queue) >= tonumber(ARGV[6]) then
  return { 'WAITLIST_FULL', ARGV[6], '' }
end

-- %d, not tostring: seqs start above a generation (16 digits), past %.14g.
local seq = string.format('%d', redis.call('HINCRBY', k.entries, '#seq', 1))
local e = { seq = seq, qty = qty, hold = tonumber(ARGV[5]), st = 'W', tok = '', joined = tostring(now) }
redis.call('HSET', k.entries, who, wait_encode(e))
redis.call('ZADD', k.queue, seq, who)
spend_pass(base, view, who, now, 'waitlist:' .. sku, k.outbox)
emit_wait(k.outbox, 'wjoin', sku, who, e, now)
-- Positions are pushed by the SKU's announcements: a waitlist change moves seq.
bump_stock(k.sku, 0, 0, 0, now)
announce(k.sku, k.channel, sku)
join_handoff(k, base, sku, ARGV[7], now, seq)
return wait_reply('OK', k.queue, sku, who, wait_entry(redis.call('HGET', k.entries, who)), 0)
