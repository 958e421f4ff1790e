-- finish_cart.lua: last step of reserving a cart. Records, in the cart's
-- home partition, how the cart ended: HELD (every line confirmed), REFUSED
-- (a line could not be had; its lines were let go) or FAILED (it could not
-- be held in time; its lines were let go).
--
-- A cart that did not hold is deleted: nothing reads it any more (a call
-- waiting on the same idempotency key reads the key's record, and a cart
-- sweep finds nothing to do), and what a refusal keeps in Redis is only its
-- idempotency record, for the rejection TTL, as a refused reserve's.
--
-- KEYS[1]  {h}cart:<token>
-- KEYS[2]  {h}cartidem:<hash>    the cart idempotency record (a placeholder key when there is none)
-- KEYS[3]  {h}cartpending        PENDING carts by deadline, HELD carts by expiry (ms)
-- ARGV[1]  token   ARGV[2] outcome: HELD, REFUSED or FAILED
-- ARGV[3]  the refusals, as the caller encodes them ("" unless REFUSED)
-- ARGV[4]  rejection TTL seconds (how long a refusal replays)   ARGV[5] retention seconds
--
-- Returns {'OK', replayed} (replayed = 1: the cart was HELD already),
-- {'ABANDONED'} (or another status) when the cart is no longer PENDING: the
-- cart sweep found it past its deadline and let its lines go, so a HELD
-- outcome is too late; {'NOT_FOUND'} when there is no such cart.
--
-- Why one script: the cart sweep (abandon_cart.lua) and this script both
-- move a PENDING cart on, and exactly one of them may: the one that finds it
-- PENDING. Safe to run twice.

local token, outcome = ARGV[1], ARGV[2]
local c = hash_get(KEYS[1])
if not c then
  redis.call('ZREM', KEYS[3], token)
  return { 'NOT_FOUND' }
end
if c['st'] == outcome then
  return { 'OK', 1 }
end
if c['st'] ~= 'PENDING' then
  return { c['st'] }
end
local now = now_ms()
local rec = c['fp'] ~= '' and hash_get(KEYS[2]) or nil
local ours = rec ~= nil and rec['tok'] == token
redis.call('ZREM', KEYS[3], token)
if outcome == 'HELD' then
  -- A held cart stays in the index, due at its expiry: the cart sweep then
  -- lets go of any line still held past it (one an interrupted extendCart
  -- extended while the cart's expiry stayed as it was).
  redis.call('ZADD', KEYS[3], c['exp'], token)
  redis.call('HSET', KEYS[1], 'st', 'HELD')
  local left = math.ceil((tonumber(c['exp']) - now) / 1000)
  redis.call('EXPIRE', KEYS[1], math.max(left, 1) + tonumber(ARGV[5]))
  if ours then
    redis.call('HSET', KEYS[2], 'code', 'OK')
  end
elseif outcome == 'REFUSED' then
  redis.call('DEL', KEYS[1])
  if ours then
    redis.call('HSET', KEYS[2], 'code', 'REFUSED', 'rej', ARGV[3])
    redis.call('EXPIRE', KEYS[2], ARGV[4])
  end
else
  redis.call('DEL', KEYS[1])
  if ours then
    -- Nothing was held: the key is a new request next time.
    redis.call('DEL', KEYS[2])
  end
end
return { 'OK', 0 }
