-- lease_members.lua: record a process as a live member of a worker kind for
-- one TTL, forget lapsed members, and count the live ones, on Redis' clock.
--
-- KEYS[1]  {p00}members:<kind>   sorted set: owner -> when its membership lapses (ms)
-- ARGV[1]  owner token   ARGV[2] TTL ms
--
-- Returns the number of live members, this one included.
--
-- Why one script: pruning, joining and counting must be one step on one
-- clock, so every process computes its share from the same set.
local now = now_ms()
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
redis.call('PEXPIRE', KEYS[1], 3 * tonumber(ARGV[2]))
return redis.call('ZCARD', KEYS[1])
