-- apply_draw.lua: write one batch of a draw's result into Redis, in draw
-- order: each winner's HELD hold, each loser's place at the back of the
-- SKU's waitlist. The result itself was decided and committed in Postgres
-- first; this only carries it over, batch after batch, resuming after a crash.
--
-- KEYS[1]  {p}sku:<sku>       KEYS[2] {p}quota:<sku>   KEYS[3] {p}expiry
-- KEYS[4]  {p}outbox          KEYS[5] {p}avail:<sku>
-- KEYS[6]  {p}wait:<sku>      KEYS[7] {p}waiters:<sku>   the SKU's waitlist
-- KEYS[8]  {p}draw:<sku>      the draw's progress: 'done', the entries applied
-- ARGV[1]  partition base, for the winners' holds (derived from the tokens
--          the ledger gave them, which carry this partition)
-- ARGV[2]  sku   ARGV[3] entries applied before this batch (its first place - 1)
-- ARGV[4]  winners' hold ms (also the losers' hold when the waitlist serves them)
-- ARGV[5]  most WAITING entries the SKU may have
-- ARGV[6]  number of entries N, then N groups of 4 in draw order:
--          kind (W won, L lost), principal, quantity, token ('' for a loser)
--
-- Returns {'OK', holds made, waiters queued}; {'SKIP', done} when the batch
-- does not start where the progress stands (it was applied already, by a
-- retry or another process: nothing is written); {'NEEDS_HYDRATION', sku}.
--
-- A winner whose hold exists already (a rebuild restored it from the ledger)
-- and a loser who has an entry already are left as they are, so even a batch
-- applied again after Redis lost the progress gives nothing twice. Losers
-- beyond the waitlist's bound are not queued. No handoff runs here: the
-- units of later batches' winners are still available while this batch is
-- written, and a loser never fits what the last winner leaves (the draw
-- skipped it because it did not fit less than that).
--
-- Why one script: the progress check, the writes and the progress move must
-- be one step, so a batch is applied once however many processes try.

local base, sku = ARGV[1], ARGV[2]
local k = { sku = KEYS[1], quota = KEYS[2], expiry = KEYS[3], outbox = KEYS[4], channel = KEYS[5],
  queue = KEYS[6], entries = KEYS[7], progress = KEYS[8] }
local s = redis.call('HMGET', k.sku, 'avail', 'gen')
if not s[2] then
  return { 'NEEDS_HYDRATION', sku }
end
local done = tonumber(redis.call('HGET', k.progress, 'done') or '0')
if done ~= tonumber(ARGV[3]) then
  return { 'SKIP', done }
end
local now = now_ms()
local hold_ms, wmax, n = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local avail = tonumber(s[1])
local holds, queued = 0, 0
for i = 0, n - 1 do
  local j = 7 + i * 4
  local kind, who, qty, token = ARGV[j], ARGV[j + 1], tonumber(ARGV[j + 2]), ARGV[j + 3]
  if kind == 'W' then
    local hk = hold_key(base, token)
    if redis.call('EXISTS', hk) == 0 and qty <= avail then
      local h = {
        sku = sku, who = who, qty = tostring(qty), st = 'HELD', exp = tostring(now + hold_ms),
        ctd = tostring(now), idem = '', fp = '', gen = s[2],
      }
      redis.call('HSET', hk, 'sku', sku, 'who', who, 'qty', h['qty'], 'st', 'HELD',
        'exp', h['exp'], 'ctd', h['ctd'], 'idem', '', 'fp', '', 'gen', s[2])
      redis.call('HINCRBY', k.quota, who, qty)
      redis.call('ZADD', k.expiry, h['exp'], token)
      bump_stock(k.sku, -qty, qty, 0, now)
      emit(k.outbox, 'reserve', token, h, now)
      avail = avail - qty
      holds = holds + 1
    end
  elseif not redis.call('HGET', k.entries, who) and redis.call('ZCARD', k.queue) < wmax then
    local seq = string.format('%d', redis.call('HINCRBY', k.entries, '#seq', 1))
    local e = { seq = seq, qty = qty, hold = hold_ms, st = 'W', tok = '', joined = tostring(now) }
    redis.call('HSET', k.entries, who, wait_encode(e))
    redis.call('ZADD', k.queue, seq, who)
    emit_wait(k.outbox, 'wjoin', sku, who, e, now)
    queued = queued + 1
  end
end
redis.call('HSET', k.progress, 'done', done + n)
bump_stock(k.sku, 0, 0, 0, now)
announce(k.sku, k.channel, sku)
return { 'OK', holds, queued }
