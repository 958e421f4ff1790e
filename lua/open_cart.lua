-- open_cart.lua: first step of a cart. Records the cart as PENDING in its
-- home partition, with the deadline by which every line must be held, or
-- replays what an idempotency key got before.
--
-- KEYS[1]  {h}cart:<token>       the cart this call opens
-- KEYS[2]  {h}cartidem:<hash>    the cart idempotency record (a placeholder key when there is none)
-- KEYS[3]  {h}cartpending        PENDING carts by deadline (ms), walked by the cart sweep
-- ARGV[1]  partition base, for the one key derived here: the cart an idempotency record
--          names (read from KEYS[2], so the caller cannot know it), through cart_key
-- ARGV[2]  principal   ARGV[3] request fingerprint ("" when the call has no idempotency key)
-- ARGV[4]  idempotency hash ("" when none)   ARGV[5] settle milliseconds (the deadline)
-- ARGV[6]  hold milliseconds   ARGV[7] lines, as the caller encodes them (kept, not read)
-- ARGV[8]  idempotency TTL seconds   ARGV[9] retention seconds   ARGV[10] this cart's token
--
-- Returns {'OK', token, who, status, created_ms, deadline_ms, expires_ms, lines, replayed}:
-- the cart opened now (replayed = 0), or the cart an earlier call opened (this call
-- again, or the first call with the key: replayed = 1; it may still be PENDING);
-- {'REFUSED', rejections, 1} when the key's first call was refused (replay it);
-- {'IDEMPOTENCY_KEY_REUSED'} when the key came with a different request.
-- A key whose cart was ABANDONED or is gone (it failed: it never held) is a new request.
--
-- Why one script: the idempotency check and the new record must be one step,
-- or two concurrent duplicates would both open a cart. Safe to run twice:
-- the same token finds its own cart.

local base, who, fp, idem = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local token = ARGV[10]

local function cart_reply(tok, c, replayed)
  return { 'OK', tok, c['who'], c['st'], tonumber(c['ctd']), tonumber(c['dl']), tonumber(c['exp']),
    c['lines'], replayed }
end

local mine = hash_get(KEYS[1])
if mine then
  return cart_reply(token, mine, 1)
end
if fp ~= '' then
  local rec = hash_get(KEYS[2])
  if rec then
    if rec['fp'] ~= fp then
      return { 'IDEMPOTENCY_KEY_REUSED' }
    end
    if rec['code'] == 'REFUSED' then
      return { 'REFUSED', rec['rej'] or '', 1 }
    end
    local c = hash_get(cart_key(base, rec['tok']))
    if c and c['st'] ~= 'ABANDONED' and c['st'] ~= 'FAILED' then
      return cart_reply(rec['tok'], c, 1)
    end
  end
end

local now = now_ms()
local c = { who = who, st = 'PENDING', ctd = tostring(now), dl = tostring(now + tonumber(ARGV[5])),
  exp = tostring(now + tonumber(ARGV[6])), lines = ARGV[7] }
redis.call('HSET', KEYS[1], 'who', who, 'st', 'PENDING', 'ctd', c['ctd'], 'dl', c['dl'], 'exp', c['exp'],
  'lines', ARGV[7], 'idem', idem, 'fp', fp)
redis.call('EXPIRE', KEYS[1], math.ceil(tonumber(ARGV[6]) / 1000) + tonumber(ARGV[9]))
redis.call('ZADD', KEYS[3], c['dl'], token)
if fp ~= '' then
  redis.call('HSET', KEYS[2], 'fp', fp, 'code', 'PENDING', 'tok', token)
  redis.call('HDEL', KEYS[2], 'rej')
  redis.call('EXPIRE', KEYS[2], ARGV[8])
end
return cart_reply(token, c, 0)
