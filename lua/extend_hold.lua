-- extend_hold.lua: give a HELD hold a new expiry, now + the hold time asked
-- for, a bounded number of times and never past the longest hold after its
-- creation (a buyer who reached the payment page gets the time to pay).
--
-- KEYS[1]  {p}hold:<token>
-- KEYS[2]  {p}expiry       HELD tokens by expiry (ms)
-- KEYS[3]  {p}outbox       the partition's event stream
-- ARGV[1]  partition base, for the keys derived here: the caller knows the hold
--          by token only, so its SKU's stock hash and channel are built from the
--          SKU read from KEYS[1] (sku_keys in lib.lua)
-- ARGV[2]  token   ARGV[3] principal   ARGV[4] hold milliseconds from now
-- ARGV[5]  most extensions a hold may have   ARGV[6] longest hold in ms after its creation
-- ARGV[7]  this call's id, chosen by the caller (unique per call)
-- ARGV[8]  retention seconds (a hold hash that has a TTL keeps it past its new expiry)
-- ARGV[9]  idempotency hash of the client's key ("" when it sent none)
-- ARGV[10] request fingerprint (the hold milliseconds asked for; "" without a key)
--
-- Returns hold_reply(code, ...) with code:
--   OK                 extended now (replayed = 0), or this very call ran before (replayed = 1:
--                      its reply was lost and the client sent it again), or the client's
--                      idempotency key extended this hold before (replayed = 1, the hold as it
--                      is now, whatever happened to it since)
--   FORBIDDEN          another principal's hold
--   EXPIRED            past its expiry (the sweeper releases it; nothing changes here)
--   ALREADY_CANCELLED  cancelled before
--   ALREADY_COMMITTED  sold
--   COMMIT_IN_PROGRESS a commit is under way (it cannot expire meanwhile): try again shortly
--   EXTENSION_LIMIT    no extension left, or the new expiry would pass the longest hold;
--                      nothing changes
-- or {'IDEMPOTENCY_KEY_REUSED'} when the key extended this hold for another length,
-- or {'NOT_FOUND'} when Redis has no such live hold (the caller asks Postgres),
-- or {'NEEDS_HYDRATION', sku} when the hold's SKU is not loaded.
--
-- The new expiry and the count of extensions (ext) are on the hold, in the
-- expiry index and in an 'extend' event of the outbox, whose id names the
-- extension's number (extend:<token>:<n>), so the ledger records each once.
-- The SKU's stock is not changed, but its sequence is bumped and announced, so
-- a reservationChanged subscriber hears of the new expiry at once.
--
-- An extension made with an idempotency key is recorded on the hold itself,
-- as the field x:<hash> = fingerprint: it lives exactly as long as the hold,
-- a hold has at most ARGV[5] of them, and the check and the record are in
-- this script, so concurrent duplicates extend once. Refusals are not
-- recorded: a refused extension changed nothing, and is refused again.
--
-- Why one script: the status and expiry check and the new expiry must be one
-- step against the sweeper. release_hold.lua expires a hold only when its
-- expiry has passed, and this script extends it only when it has not, both on
-- Redis' clock and one after the other on the hold's slot: of an extension and
-- an expiry racing, exactly one wins. A retried call (same id) replays, and so
-- does a call with the same idempotency key and length.

local base, token, who, call = ARGV[1], ARGV[2], ARGV[3], ARGV[7]
local keyed = ARGV[9] ~= ''
local record = 'x:' .. ARGV[9]
if not is_int(ARGV[4], 1000, tonumber(ARGV[6])) or call == '' then
  return { 'INVALID_INPUT', 'holdSeconds', 'out of range' }
end
local h, k, refusal = holder_hold(base, KEYS[1], token, who)
if refusal then
  return refusal
end
if h['xid'] == call then
  return hold_reply('OK', token, h, 1)
end
if keyed and h[record] then
  if h[record] ~= ARGV[10] then
    return { 'IDEMPOTENCY_KEY_REUSED' }
  end
  return hold_reply('OK', token, h, 1)
end
local st = h['st']
if st == 'COMMITTED' then
  return hold_reply('ALREADY_COMMITTED', token, h, 1)
end
if st == 'COMMITTING' then
  return hold_reply('COMMIT_IN_PROGRESS', token, h, 1)
end
if st == 'CANCELLED' then
  return hold_reply('ALREADY_CANCELLED', token, h, 1)
end
if st == 'EXPIRED' then
  return hold_reply('EXPIRED', token, h, 1)
end
local now = now_ms()
if now >= tonumber(h['exp']) then
  return hold_reply('EXPIRED', token, h, 0)
end
local ext = tonumber(h['ext'] or '0')
local exp = now + tonumber(ARGV[4])
if ext >= tonumber(ARGV[5]) or exp > tonumber(h['ctd']) + tonumber(ARGV[6]) then
  return hold_reply('EXTENSION_LIMIT', token, h, 0)
end

h['exp'], h['ext'] = tostring(exp), tostring(ext + 1)
redis.call('HSET', KEYS[1], 'exp', h['exp'], 'ext', h['ext'], 'xid', call)
if keyed then
  redis.call('HSET', KEYS[1], record, ARGV[10])
end
if redis.call('PTTL', KEYS[1]) > 0 then
  -- A restored hold's hash ends some time after its expiry: after the new one.
  redis.call('PEXPIREAT', KEYS[1], exp + tonumber(ARGV[8]) * 1000)
end
redis.call('ZADD', KEYS[2], exp, token)
emit(KEYS[3], 'extend', token, h, now, 'extend:' .. token .. ':' .. h['ext'])
bump_stock(k.sku, 0, 0, 0, now)
announce(k.sku, k.channel, h['sku'])
return hold_reply('OK', token, h, 0)
