-- lease_acquire.lua: take a worker lease when it is free, when it is ours
-- already (a renew whose reply was lost), or when it has no expiry (stale by
-- construction: no writer of this code leaves one). Each success draws a fresh
-- fencing token.
--
-- KEYS[1]  {p}lease:<kind>         the owner token while the lease is held
-- KEYS[2]  {p}lease:<kind>:fence   the fencing counter (same hash tag)
-- ARGV[1]  owner token   ARGV[2] TTL ms
--
-- Returns {1, fencing token} or {0, remaining ms of the current owner}.
--
-- Why one script: the ownership check, the SET and the fencing draw must be
-- one step, or two callers could both see the lease free and both take it,
-- or take it under the same fencing token. The counter is floored at Redis'
-- clock in microseconds, so tokens keep growing after Redis lost the counter.
local cur = redis.call('GET', KEYS[1])
if cur and cur ~= ARGV[1] then
  local pttl = redis.call('PTTL', KEYS[1])
  if pttl >= 0 then
    return { 0, pttl }
  end
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local f = redis.call('INCR', KEYS[2])
if f < now then
  f = now
  redis.call('SET', KEYS[2], string.format('%d', f))
end
return { 1, f }
