-- apply_drop.lua: bring a drop's Redis copy up to a newer Postgres version
-- (the drop was created, a SKU joined it, or Redis lost the copy).
--
-- KEYS[1]  {p}drop:<id>     the drop's hash (max start end ver skus), in the drop's partition
-- ARGV[1]  version   ARGV[2] max per user   ARGV[3] sale start ms (0 = none)
-- ARGV[4]  sale end ms (0 = none)   ARGV[5] the drop's SKUs, separated by spaces
--
-- Returns {'OK'}, or {'STALE'} when Redis has this version or a newer one (an
-- older write never overwrites a newer one).
--
-- Why one script: the version check and the write must be one step, or a
-- slow writer of an older version (a SKU list without the newest member)
-- could overwrite a newer one. A drop's version rises with each SKU that
-- joins, in the same Postgres transaction as the SKU's row; a SKU goes live
-- in Redis only after its rebuild has applied the drop, so no SKU of a drop
-- can be reserved while the drop's list here lacks it.

local ver = redis.call('HGET', KEYS[1], 'ver')
if ver and tonumber(ver) >= tonumber(ARGV[1]) then
  return { 'STALE' }
end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'ver', ARGV[1], 'max', ARGV[2], 'start', ARGV[3], 'end', ARGV[4], 'skus', ARGV[5])
return { 'OK' }
