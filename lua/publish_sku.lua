-- publish_sku.lua: last step of a SKU's rebuild. Once every chunk is written
-- (hydrate_sku.lua), makes the SKU live: its stock hash with the rebuild's
-- generation, and the staged quota hash in place of the old one.
--
-- KEYS[1]  {p}sku:<sku>            must still be absent
-- KEYS[2]  {p}rebuild:<sku>        the rebuild under way (gen, next)
-- KEYS[3]  {p}rebuild:<sku>:quota  the staged quota hash
-- KEYS[4]  {p}quota:<sku>          the SKU's quota hash
-- KEYS[5]  {p}avail:<sku>          the SKU's announce channel
-- ARGV[1]  sku   ARGV[2] generation   ARGV[3] number of chunks written
-- ARGV[4]  total   ARGV[5] sold   ARGV[6] max per user (0 = none)
-- ARGV[7]  sale start ms (0 = none)   ARGV[8] sale end ms (0 = none)   ARGV[9] product version
-- ARGV[10] held   ARGV[11] available
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
-- outlive it.

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
redis.call('DEL', KEYS[2])
-- Anything left under the stock hash's name is not a loaded SKU (it has no gen).
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'total', ARGV[4], 'sold', ARGV[5], 'held', ARGV[10], 'avail', ARGV[11],
  'max', ARGV[6], 'start', ARGV[7], 'end', ARGV[8], 'ver', ARGV[9], 'seq', gen, 'upd', now_ms(), 'gen', gen)
announce(KEYS[1], KEYS[5], sku)
return { 'OK' }
