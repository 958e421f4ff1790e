-- rate_limit.lua: spend units of a principal's mutation budget (one per
-- mutation, one per line of a cart), or say how long to wait for them.
--
-- KEYS[1]  the budget's key (rate:<prefix>budget:<principal>; its own slot)
-- ARGV[1]  burst   ARGV[2] rate   ARGV[3] period in seconds
-- ARGV[4]  how many units the mutation spends (at most the burst)
--
-- Returns {1} when the mutation may go ahead (the units are spent), or {0,
-- retry_after} with the seconds to wait as a string. The budget is GCRA as
-- lib.lua's rate_check computes it; reserve.lua spends it the same way for
-- the reserves it decides itself.
--
-- Why one script: the read of the budget and its spending must be one step,
-- or two concurrent mutations could both spend the last unit.

local interval, offset = rate_budget(tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]))
local ok, a, b = rate_check(KEYS[1], interval, offset, rate_now(redis.call('TIME')), tonumber(ARGV[4]))
if not ok then
  return { 0, a }
end
rate_spend(KEYS[1], a, b)
return { 1 }
