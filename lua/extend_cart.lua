-- extend_cart.lua: last step of extending a cart. Every line has its new
-- expiry already; record it as the cart's, and move the cart in the index of
-- the cart sweep to it.
--
-- KEYS[1]  {h}cart:<token>
-- KEYS[2]  {h}cartpending        PENDING carts by deadline, HELD carts by expiry (ms)
-- ARGV[1]  token   ARGV[2] the new expiry (ms)   ARGV[3] retention seconds
--
-- Returns {'OK'}; {'EXPIRED'} when the cart's recorded expiry has passed
-- (the cart sweep lets its lines go: it is too late to extend it);
-- {status} when the cart is not HELD; {'NOT_FOUND'} when there is no cart.
--
-- Why one script: the check that the cart is still live and the move of its
-- expiry must be one step against the cart sweep, which lets go of a cart's
-- lines once its recorded expiry has passed. Until this runs the cart keeps
-- its old expiry, so an extension interrupted half-way (some lines extended,
-- some not) ends when the cart would have: the sweep lets go of the lines it
-- extended. Safe to run twice.

local token, exp = ARGV[1], tonumber(ARGV[2])
local c = hash_get(KEYS[1])
if not c then
  return { 'NOT_FOUND' }
end
if c['st'] ~= 'HELD' then
  return { c['st'] }
end
local now = now_ms()
if now >= tonumber(c['exp']) then
  return { 'EXPIRED' }
end
if exp > tonumber(c['exp']) then
  redis.call('HSET', KEYS[1], 'exp', tostring(exp))
  redis.call('ZADD', KEYS[2], exp, token)
  redis.call('EXPIRE', KEYS[1], math.ceil((exp - now) / 1000) + tonumber(ARGV[3]))
end
return { 'OK' }
