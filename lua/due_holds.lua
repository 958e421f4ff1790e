-- due_holds.lua: list a partition's holds whose expiry has passed, by Redis'
-- clock (the same clock reserve.lua stamps expiries with).
--
-- KEYS[1]  {p}expiry   (sorted set: token -> expires_ms)
-- ARGV[1]  the most tokens to return
--
-- Returns {now_ms, token...}. Read-only: each token is then released by
-- release_hold.lua, which checks again that it is due and still HELD.
--
-- Why one script: "due" is judged on Redis' clock, the one reserve.lua stamps
-- expiries with; reading TIME and the range in one step keeps the caller's
-- clock out of it.

local now = now_ms()
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
table.insert(due, 1, now)
return due
