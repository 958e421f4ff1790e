-- apply_draw.lua: write one batch of a draw's result into Redis: each
-- winner's HELD hold, each loser's place at the back of the SKU's waitlist.
-- The result itself was decided and committed in Postgres first; this only
-- carries it over, batch after batch, resuming after a crash. The caller
-- sends every winner (in draw order) before any loser (in draw order).
--
-- KEYS[1]  {p}sku:<sku>       KEYS[2] {p}quota:<sku>   KEYS[3] {p}expiry
-- KEYS[4]  {p}outbox          KEYS[5] {p}avail:<sku>
-- KEYS[6]  {p}wait:<sku>      KEYS[7] {p}waiters:<sku>   the SKU's waitlist
-- KEYS[8]  {p}draw:<sku>      the draw's progress: 'done', the entries applied;
--                             'short:<token>', the refusal of a winner who could not be held
-- ARGV[1]  partition base, for the keys derived here: the winners' holds (from the
--          tokens the ledger gave them, which carry this partition) and the holds a
--          handoff makes (from the tokens made here)
-- ARGV[2]  sku   ARGV[3] entries applied before this batch (its first place - 1)
-- ARGV[4]  winners' hold ms (also the losers' hold when the waitlist serves them)
-- ARGV[5]  most WAITING entries the SKU may have   ARGV[6] nonce (offer_token)
-- ARGV[7]  number of entries N, then N groups of 4:
--          kind (W won, L lost), principal, quantity, token ('' for a loser)
--
-- Each winner is asked of may_take (lib.lua) on the 'draw' path, the policy
-- every path that hands out units shares: the product's sale mode must
-- admit a draw's result, the per-person limit allow, and the units fit what
-- is available. A winner who may not take its units (the draw counted units
-- that were not there) is never skipped silently: its refusal is recorded in
-- the progress hash (the caller records it in the ledger, logs and counts
-- it), and the winner is put in the waitlist at once, for its quantity and
-- the winners' hold. As every winner is applied before any loser, such a
-- winner waits ahead of every loser: the first units freed that fit are its.
--
-- Returns {'OK', holds made, waiters queued, winners not held}; {'SKIP', done}
-- when the batch does not start where the progress stands (it was applied
-- already, by a retry or another process: nothing is written);
-- {'NEEDS_HYDRATION', sku}.
--
-- A winner whose hold exists already (a rebuild restored it from the ledger)
-- and a loser who has an entry already are left as they are, so even a batch
-- applied again after Redis lost the progress gives nothing twice. Losers
-- beyond the waitlist's bound are not queued. A batch with losers ends with a
-- handoff (lib.lua): every winner is applied by then, so the units a winner
-- freed meanwhile (its cancel found no one to hand them to) go to the losers
-- in draw order. No handoff runs while winners are still being applied: the
-- units of later winners must stay theirs.
--
-- Why one script: the progress check, the writes and the progress move must
-- be one step, so a batch is applied once however many processes try.

local base, sku = ARGV[1], ARGV[2]
local k = { sku = KEYS[1], quota = KEYS[2], expiry = KEYS[3], outbox = KEYS[4], channel = KEYS[5],
  queue = KEYS[6], entries = KEYS[7], progress = KEYS[8] }
local s = redis.call('HMGET', k.sku, 'avail', 'gen', 'max', 'start', 'end', 'drop', 'mode')
if not s[2] then
  return { 'NEEDS_HYDRATION', sku }
end
local done = tonumber(redis.call('HGET', k.progress, 'done') or '0')
if done ~= tonumber(ARGV[3]) then
  return { 'SKIP', done }
end
local now = now_ms()
local hold_ms, wmax, n = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[7])
local view = sku_view(sku, s, 3, k.quota, tonumber(s[1]))

-- queue puts who at the back of the waitlist, asking qty units.
local function queue(who, qty)
  local seq = string.format('%d', redis.call('HINCRBY', k.entries, '#seq', 1))
  local e = { seq = seq, qty = qty, hold = hold_ms, st = 'W', tok = '', joined = tostring(now) }
  redis.call('HSET', k.entries, who, wait_encode(e))
  redis.call('ZADD', k.queue, seq, who)
  emit_wait(k.outbox, 'wjoin', sku, who, e, now)
end

local holds, queued, short, losers = 0, 0, 0, false
for i = 0, n - 1 do
  local j = 8 + i * 4
  local kind, who, qty, token = ARGV[j], ARGV[j + 1], tonumber(ARGV[j + 2]), ARGV[j + 3]
  if kind == 'W' then
    if redis.call('EXISTS', hold_key(base, token)) == 0 then
      local no = may_take('draw', base, view, who, qty, now)
      if no and no[1] == 'NEEDS_HYDRATION' then
        return no
      elseif not no then
        give_hold(k, base, token, sku, who, qty, hold_ms, s[2], now)
        view.free = view.free - qty
        holds = holds + 1
      elseif not redis.call('HGET', k.progress, 'short:' .. token) then
        redis.call('HSET', k.progress, 'short:' .. token, no[1])
        short = short + 1
        if not redis.call('HGET', k.entries, who) then
          queue(who, qty)
          queued = queued + 1
        end
      end
    end
  else
    losers = true
    if not redis.call('HGET', k.entries, who) and redis.call('ZCARD', k.queue) < wmax then
      queue(who, qty)
      queued = queued + 1
    end
  end
end
redis.call('HSET', k.progress, 'done', done + n)
bump_stock(k.sku, 0, 0, 0, now)
announce(k.sku, k.channel, sku)
if losers then
  handoff(k, base, sku, ARGV[6], now)
end
return { 'OK', holds, queued, short }
