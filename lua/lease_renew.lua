-- lease_renew.lua: extend a worker lease, only for its owner.
--
-- KEYS[1]  {p}lease:<kind>
-- ARGV[1]  owner token   ARGV[2] TTL ms
--
-- Returns 1 when extended, 0 when the lease is not this owner's.
--
-- Why one script: the owner check and the PEXPIRE must be one step, or a
-- holder that lost its lease could extend its successor's.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
