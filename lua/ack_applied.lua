-- ack_applied.lua: acknowledge outbox entries whose events the ledger has just
-- applied, unless a SKU of theirs was rebuilt since the events were written.
--
-- KEYS[1]  {p}outbox        the partition's event stream
-- KEYS[2..n+1] {p}sku:<sku> the SKU of each generation checked
-- ARGV[1]  the consumer group   ARGV[2] n, how many generations are checked
-- ARGV[3..n+2] the generation that events of the batch carry for KEYS[i+1]
-- ARGV[n+3..]  the entries' stream ids
--
-- Returns {1} after acknowledging every entry, when each SKU checked still has
-- the generation its events carry or is missing (it will be rebuilt from the
-- ledger, which has the batch); a stream or group Redis lost counts as
-- acknowledged. Returns {0}, acknowledging nothing, when a SKU has another
-- generation: the caller then tells Redis what the ledger says of that SKU's
-- holds (reconcile_hold.lua) and acknowledges afterwards.
--
-- Why one script: the acknowledgement depends on the generations, and the
-- write-behind would otherwise read them in one round trip and acknowledge
-- in another, for every batch, although a rebuild in between is rare.

local n = tonumber(ARGV[2])
for i = 1, n do
  local gen = redis.call('HGET', KEYS[i + 1], 'gen')
  if gen and gen ~= ARGV[i + 2] then
    return {0}
  end
end
local i, last = n + 3, #ARGV
while i <= last do
  local j = math.min(i + 999, last) -- unpack's arguments are bounded
  local r = redis.pcall('XACK', KEYS[1], ARGV[1], unpack(ARGV, i, j))
  if type(r) == 'table' and r.err then
    if string.sub(r.err, 1, 7) == 'NOGROUP' then
      return {1}
    end
    return redis.error_reply(r.err)
  end
  i = j + 1
end
return {1}
