-- stage_waitlist.lua: a step of a SKU's rebuild (after its holds are staged,
-- before publish_sku.lua): writes one chunk of the SKU's waitlist, as the
-- ledger has it, into the staged queue and entries.
--
-- KEYS[1]  {p}sku:<sku>                must still be absent
-- KEYS[2]  {p}rebuild:<sku>            the rebuild under way (gen)
-- KEYS[3]  {p}rebuild:<sku>:wait       the staged queue
-- KEYS[4]  {p}rebuild:<sku>:waiters    the staged entries
-- ARGV[1]  generation   ARGV[2] seconds the staged keys live
-- ARGV[3]  the highest seq the ledger has for the SKU (kept as '#seq')
-- ARGV[4]  "1" for the first chunk, which clears what an earlier rebuild
--          that died may have staged
-- ARGV[5..] entries, 7 values each: principal, seq, quantity, hold ms,
--          status (W or O), token ("" unless O), joined ms
--
-- Returns {'OK'}, {'EXISTS'} when the SKU is loaded already, or {'STALE'}
-- when another rebuild has staged since (nothing is written in either case).
-- Writing a chunk twice writes the same fields again.
--
-- Why one script: the generation check and the writes must be one step, or a
-- superseded rebuild could write into the staging of a newer one.

if redis.call('HEXISTS', KEYS[1], 'gen') == 1 then
  return { 'EXISTS' }
end
if redis.call('HGET', KEYS[2], 'gen') ~= ARGV[1] then
  return { 'STALE' }
end
local ttl = ARGV[2]
if ARGV[4] == '1' then
  redis.call('DEL', KEYS[3], KEYS[4])
end
if tonumber(redis.call('HGET', KEYS[4], '#seq') or '0') < tonumber(ARGV[3]) then
  redis.call('HSET', KEYS[4], '#seq', ARGV[3])
end
for i = 5, #ARGV, 7 do
  local who, seq, st = ARGV[i], ARGV[i + 1], ARGV[i + 4]
  redis.call('HSET', KEYS[4], who, wait_encode({ seq = seq, qty = ARGV[i + 2], hold = ARGV[i + 3], st = st,
    tok = ARGV[i + 5], joined = ARGV[i + 6] }))
  if st == 'W' then
    redis.call('ZADD', KEYS[3], seq, who)
  end
end
redis.call('EXPIRE', KEYS[4], ttl)
if redis.call('EXISTS', KEYS[3]) == 1 then
  redis.call('EXPIRE', KEYS[3], ttl)
end
return { 'OK' }
