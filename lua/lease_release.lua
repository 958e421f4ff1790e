-- lease_release.lua: give a worker lease up, only for its owner.
--
-- KEYS[1]  {p}lease:<kind>
-- ARGV[1]  owner token
--
-- Returns 1 when deleted, 0 when the lease is not this owner's.
--
-- Why one script: the owner check and the DEL must be one step, or a holder
-- that lost its lease could delete its successor's.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
