-- publish_sku.lua: last step of a SKU's rebuild. Once every chunk is written
-- (hydrate_sku.lua), makes the SKU live: its stock hash with the rebuild's
-- generation, and the staged quota hash in place of the old one.
--
-- KEYS[1]  {p}sku:<sku>            must still be absent
-- KEYS[2]  {p}rebuild:<sku>        the rebuild under way (gen, next)
-- KEYS[3]  {p}rebuild:<sku>:quota  the staged quota hash
-- KEYS[4]  {p}quota:<sku>          the SKU's quota hash
-- KEYS[5]  {p}avail:<sku>          the SKU's announce channel
-- KEYS[6]  {p}rebuild:<sku>:wait   KEYS[7] {p}rebuild:<sku>:waiters   the staged waitlist
-- KEYS[8]  {p}wait:<sku>           KEYS[9] {p}waiters:<sku>           the SKU's waitlist
-- KEYS[10] {p}expiry               KEYS[11] {p}outbox
-- ARGV[1]  sku   ARGV[2] generation   ARGV[3] number of chunks written
-- ARGV[4]  total   ARGV[5] sold   ARGV[6] max per user (0 = none)
-- ARGV[7]  sale start ms (0 = none)   ARGV[8] sale end ms (0 = none)   ARGV[9] product version
-- ARGV[10] held   ARGV[11] available
-- ARGV[12] partition base, for the holds handed to waiters (derived from the
--          tokens made here)   ARGV[13] nonce for those tokens (offer_token)
-- ARGV[14] the drop the SKU belongs to ("" for none)
-- ARGV[15] the product's sale mode (package inventory/policy: first_come or
--          draw), written to the stock hash's 'mode' for may_take in lib.lua
--
-- Returns {'OK'} after publishing, {'EXISTS'} when the SKU is already loaded,
-- or {'STALE'} when a newer rebuild has staged since or a chunk is missing
-- (nothing is written in either case).
--
-- Why one script: a reader must see either no SKU (and wait for the rebuild)
-- or all of it, never counters without their holds or quotas. The holds are
-- already written under the generation; giving the SKU that generation is
-- what makes them count, in this one step. Quotas of the SKU's earlier life
-- are replaced wholesale, so a count left by a hold that was lost cannot
-- outlive it. The waitlist is replaced the same way, by the one staged from
-- the ledger (stage_waitlist.lua), and the units the rebuild finds available
-- are handed to its waiters (handoff in lib.lua) before anyone can reserve
-- them. The queue's next seq is put above the generation, so entries made in
-- this life come after every entry of the earlier ones.

if redis.call('HEXISTS', KEYS[1], 'gen') == 1 then
  return { 'EXISTS' }
end
local r = redis.call('HMGET', KEYS[2], 'gen', 'next')
if r[1] ~= ARGV[2] or r[2] ~= ARGV[3] then
  return { 'STALE' }
end

local sku, gen = ARGV[1], ARGV[2]
if redis.call('EXISTS', KEYS[3]) == 1 then
  redis.call('RENAME', KEYS[3], KEYS[4])
  redis.call('PERSIST', KEYS[4])
else
  redis.call('DEL', KEYS[4])
end
for i = 6, 7 do
  if redis.call('EXISTS', KEYS[i]) == 1 then
    redis.call('RENAME', KEYS[i], KEYS[i + 2])
    redis.call('PERSIST', KEYS[i + 2])
  else
    redis.call('DEL', KEYS[i + 2])
  end
end
if tonumber(redis.call('HGET', KEYS[9], '#seq') or '0') < tonumber(gen) then
  redis.call('HSET', KEYS[9], '#seq', gen)
end
redis.call('DEL', KEYS[2])
-- Anything left under the stock hash's name is not a loaded SKU (it has no gen).
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'total', ARGV[4], 'sold', ARGV[5], 'held', ARGV[10], 'avail', ARGV[11],
  'max', ARGV[6], 'start', ARGV[7], 'end', ARGV[8], 'ver', ARGV[9], 'seq', gen, 'upd', now_ms(), 'gen', gen,
  'drop', ARGV[14] or '', 'mode', ARGV[15] or '')
announce(KEYS[1], KEYS[5], sku)
handoff({ sku = KEYS[1], quota = KEYS[4], channel = KEYS[5], queue = KEYS[8], entries = KEYS[9],
  expiry = KEYS[10], outbox = KEYS[11] }, ARGV[12], sku, ARGV[13], now_ms())
return { 'OK' }
