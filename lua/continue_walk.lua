-- continue_walk.lua: take a SKU's unfinished waitlist walk one run further
-- (walk in lib.lua: at most walk_budget of work per run).
--
-- KEYS[1]  {p}sku:<sku>       KEYS[2] {p}quota:<sku>
-- KEYS[3]  {p}wait:<sku>      KEYS[4] {p}waiters:<sku>
-- KEYS[5]  {p}expiry          KEYS[6] {p}outbox   KEYS[7] {p}avail:<sku>
-- KEYS[8]  {p}walks           the partition's unfinished walks (walks_key in lib.lua)
-- ARGV[1]  partition base, for the keys derived here: the holds handed over
--          (from the tokens made here), and for a SKU of a drop, the drop's hash and
--          the stock and quota hashes of its SKUs (may_take in lib.lua)
-- ARGV[2]  sku   ARGV[3] nonce (offer_token)
--
-- Returns {'PENDING', offers} when the walk is still unfinished after this
-- run, {'DONE', offers} when it ended now or there was none (a SKU that is
-- no longer loaded, or whose walk ended, leaves the set of walks).
--
-- Why one script: each run reads where the walk stopped, examines the next
-- entries and records where it stops in one step, so runs by several
-- processes at once (the worker group's walk sweep, a reserve that found
-- the walk unfinished) take turns on one walk and never hand a unit twice.

local base, sku = ARGV[1], ARGV[2]
local k = { sku = KEYS[1], quota = KEYS[2], queue = KEYS[3], entries = KEYS[4], expiry = KEYS[5],
  outbox = KEYS[6], channel = KEYS[7] }
local w = redis.call('HMGET', k.sku, 'walk', 'walkq')
if not w[1] then
  redis.call('ZREM', KEYS[8], sku)
  return { 'DONE', 0 }
end
local offers, pending = walk(k, base, sku, ARGV[3], now_ms(), w[1], tonumber(w[2] or ''), true)
return { pending and 'PENDING' or 'DONE', offers }
