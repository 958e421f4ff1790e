-- stage_rebuild.lua: first step of rebuilding a SKU in Redis from Postgres.
-- Picks the generation the rebuild writes under and stages it, so that every
-- chunk and the final publish can check they still belong to this rebuild.
--
-- KEYS[1]  {p}sku:<sku>            the SKU's stock hash (must be absent)
-- KEYS[2]  {p}rebuild:<sku>        the rebuild under way: gen, next (chunks written)
-- KEYS[3]  {p}rebuild:<sku>:quota  the quota hash this rebuild stages
-- ARGV[1]  seconds the staged keys live (a rebuild that died leaves nothing for ever)
--
-- Returns {'OK', gen}, or {'EXISTS'} when the SKU is already loaded (another
-- caller rebuilt it first; nothing is written).
--
-- Why one script: the existence check and the staging must be one step, or a
-- rebuild could stage after another had already published. A newer stage
-- replaces an older one: the older rebuild's chunks and publish are refused
-- from then on (see hydrate_sku.lua), and what it wrote before does not count.

if redis.call('HEXISTS', KEYS[1], 'gen') == 1 then
  return { 'EXISTS' }
end
-- The generation is Redis' clock in microseconds, and always above the
-- generation of a rebuild staged before it.
local gen = now_us()
local prev = redis.call('HGET', KEYS[2], 'gen')
if prev and tonumber(prev) >= tonumber(gen) then
  gen = string.format('%d', tonumber(prev) + 1)
end
redis.call('DEL', KEYS[2], KEYS[3])
redis.call('HSET', KEYS[2], 'gen', gen, 'next', 0)
redis.call('EXPIRE', KEYS[2], ARGV[1])
return { 'OK', gen }
