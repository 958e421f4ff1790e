-- begin_commit.lua: first step of a commit. Takes a HELD hold out of reach of
-- expiry by moving it to COMMITTING, so the sale can be written to Postgres
-- while no sweeper can release its units.
--
-- KEYS[1]  {p}hold:<token>
-- KEYS[2]  {p}expiry       HELD tokens by expiry (ms)
-- KEYS[3]  {p}committing   COMMITTING tokens by start (ms)
-- KEYS[4]  {p}outbox       the partition's event stream
-- ARGV[1]  partition base, for the keys derived here: the caller knows the hold
--          by token only, so its SKU's stock hash, quota hash and channel are
--          built from the SKU read from KEYS[1] (sku_keys in lib.lua)
-- ARGV[2]  token   ARGV[3] principal   ARGV[4] retention seconds
-- ARGV[5]  this attempt's id, chosen by the caller (unique per attempt)
-- ARGV[6]  nonce for the tokens of holds handed to waiters (offer_token): a
--          hold found past its expiry is released here, and its units go to
--          the SKU's waiters first (handoff; its waitlist keys and the new
--          holds' keys are derived, like the SKU's, from the hold read)
--
-- Returns hold_reply(code, ...) with code:
--   OK                 the hold is COMMITTING (go on and write the sale) or already COMMITTED;
--                      four more values follow: this attempt's id (cst), 1 when this attempt
--                      moved the hold from HELD (0 when it joined one under way), and the
--                      hold's idempotency hash and request fingerprint ("" when none), which
--                      the sale row records so the key replays the sale after Redis loss
--   FORBIDDEN          another principal's hold; nothing changes
--   EXPIRED            past its expiry: released here (exactly once) if the sweeper had not yet
--   ALREADY_CANCELLED  cancelled before
-- or {'NOT_FOUND'} when Redis has no such live hold (the caller asks Postgres),
-- or {'NEEDS_HYDRATION', sku} when the hold's SKU is not loaded (the caller
-- rebuilds it from Postgres and tries again).
--
-- Why one script: reading the status and changing it must be one step, or the
-- sweeper could release the units between the two and they would be both
-- released and sold. A COMMITTING hold is reported as OK again, so concurrent or
-- retried commits all go on to the idempotent Postgres write. Each attempt
-- stamps the hold with its own id (cst), and only the attempt whose id is
-- still on the hold may put it back to HELD (finish_commit.lua RESTORE): an
-- attempt that failed can never undo the protection of one still writing. The
-- id comes from the caller, so a call the Redis client sends again after a
-- lost reply finds its own id on the hold and answers as the first time (cmv
-- remembers whether this attempt moved the hold): it is the same attempt, and
-- its RESTORE still works.

local base, token, who, attempt = ARGV[1], ARGV[2], ARGV[3], ARGV[5]
if not attempt or attempt == '' then
  return { 'INVALID_INPUT', 'attempt', 'an attempt id is required' }
end
local h, k, refusal = holder_hold(base, KEYS[1], token, who)
if refusal then
  return refusal
end
k.hold, k.expiry, k.committing, k.outbox = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local st = h['st']
if st == 'COMMITTED' then
  return hold_reply('OK', token, h, 1)
end
-- attempt_reply is OK with this attempt's id, whether it moved the hold, and
-- the hold's idempotency data.
local function attempt_reply(moved)
  local r = hold_reply('OK', token, h, 0)
  table.insert(r, attempt)
  table.insert(r, moved)
  table.insert(r, h['idem'] or '')
  table.insert(r, h['fp'] or '')
  return r
end
if st == 'COMMITTING' then
  if h['cst'] == attempt then
    -- This very call again (its reply was lost): the same attempt.
    return attempt_reply(tonumber(h['cmv'] or '0'))
  end
  -- Join the attempt under way: this attempt's id, and a fresh start for the
  -- reconciler, which leaves a commit alone while any attempt may be writing.
  redis.call('HSET', KEYS[1], 'cst', attempt, 'cmv', '0')
  redis.call('ZADD', k.committing, now_ms(), token)
  return attempt_reply(0)
end
if st == 'CANCELLED' then
  return hold_reply('ALREADY_CANCELLED', token, h, 1)
end
if st == 'EXPIRED' then
  return hold_reply('EXPIRED', token, h, 1)
end

local now = now_ms()
if now >= tonumber(h['exp']) then
  release(k, token, h, 'EXPIRED', now, tonumber(ARGV[4]))
  local w = wait_keys(ARGV[1], h['sku'])
  k.queue, k.entries = w.queue, w.entries
  handoff(k, ARGV[1], h['sku'], ARGV[6], now, h['who'])
  return hold_reply('EXPIRED', token, h, 0)
end
redis.call('HSET', KEYS[1], 'st', 'COMMITTING', 'cst', attempt, 'cmv', '1')
redis.call('ZREM', k.expiry, token)
redis.call('ZADD', k.committing, now, token)
h['st'] = 'COMMITTING'
return attempt_reply(1)
