-- abandon_cart.lua: the cart sweep's step. A cart still PENDING past its
-- deadline belongs to a call that died or stalled between holding its lines
-- and recording the outcome: mark it ABANDONED, so that call can no longer
-- record it as HELD, and hand its lines to the caller, who releases them.
--
-- KEYS[1]  {h}cart:<token>
-- KEYS[2]  {h}cartpending        PENDING carts by deadline, HELD carts by expiry (ms)
-- ARGV[1]  token
--
-- A HELD cart is in KEYS[2] too, due at its expiry: past it, every line
-- still held must go (the lines expire with their cart; one that an
-- interrupted extendCart extended, while the cart kept its expiry, would
-- otherwise outlive it).
--
-- Returns {'OK', who, lines}: the cart is ABANDONED (now, or by an earlier
-- sweep whose releases may not have finished: release them again, they are
-- idempotent, then ZREM the token from KEYS[2]); {'EXPIRED', who, lines}: a
-- HELD cart past its expiry (release what is still held, likewise);
-- {'NOT_DUE'} before the deadline or the expiry; {status} when the cart
-- ended otherwise (the token is dropped from KEYS[2]); {'NOT_FOUND'} when the
-- cart is gone (likewise).
--
-- Why one script: finish_cart.lua and this script both move a PENDING cart
-- on, and exactly one of them may. After the deadline no line of the cart can
-- be held or confirmed any more (hold_cart_lines.lua and
-- confirm_cart_lines.lua refuse), so the lines named here are all the cart
-- will ever have.

local token = ARGV[1]
local c = hash_get(KEYS[1])
if not c then
  redis.call('ZREM', KEYS[2], token)
  return { 'NOT_FOUND' }
end
if c['st'] == 'PENDING' then
  if now_ms() < tonumber(c['dl']) then
    return { 'NOT_DUE' }
  end
  redis.call('HSET', KEYS[1], 'st', 'ABANDONED')
  c['st'] = 'ABANDONED'
end
if c['st'] == 'ABANDONED' then
  return { 'OK', c['who'], c['lines'] }
end
if c['st'] == 'HELD' then
  if now_ms() < tonumber(c['exp']) then
    return { 'NOT_DUE' }
  end
  return { 'EXPIRED', c['who'], c['lines'] }
end
redis.call('ZREM', KEYS[2], token)
return { c['st'] }
