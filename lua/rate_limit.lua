-- rate_limit.lua: spend one unit of a principal's mutation budget, or say
-- how long to wait for one.
--
-- KEYS[1]  the budget's key (rate:<prefix>mutations:<principal>; its own slot)
-- ARGV[1]  burst   ARGV[2] rate   ARGV[3] period in seconds
--
-- Returns {1} when the mutation may go ahead (the unit is spent), or {0,
-- retry_after} with the seconds to wait as a string. The budget is GCRA as
-- lib.lua's rate_check computes it; reserve.lua spends it the same way for
-- the reserves it decides itself.
--
-- Why one script: the read of the budget and its spending must be one step,
-- or two concurrent mutations could both spend the last unit.

local ok, a, b = rate_check(KEYS[1], ARGV[1], ARGV[2], ARGV[3], rate_now(redis.call('TIME')))
if not ok then
  return { 0, a }
end
rate_spend(KEYS[1], a, b)
return { 1 }
