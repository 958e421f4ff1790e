-- reserve.lua: take units of one SKU for one principal, or say why not.
--
-- KEYS[1]  {p}sku:<sku>          stock hash (total avail held sold max start end ver seq upd gen)
-- KEYS[2]  {p}hold:<token>       the hold this call creates
-- KEYS[3]  {p}quota:<sku>        units each principal holds or bought of this SKU (field: principal)
-- KEYS[4]  {p}idem:<hash>        idempotency record (a placeholder key when there is none)
-- KEYS[5]  {p}expiry             HELD tokens by expiry (ms)
-- KEYS[6]  {p}outbox             the partition's event stream
-- KEYS[7]  {p}avail:<sku>        the SKU's announce channel
-- ARGV[1]  partition base, for the keys derived here (e.g. "dl:{p07}:"): the hold an
--          idempotency record names (read from KEYS[4], so the caller cannot know it); and
--          for a SKU of a drop (its stock hash names the drop), the drop's hash and the stock
--          and quota hashes of each of the drop's SKUs (at most 100, listed in the drop's hash)
-- ARGV[2]  sku          ARGV[3] principal   ARGV[4] quantity   ARGV[5] hold milliseconds
-- ARGV[6]  token        ARGV[7] request fingerprint ("" when the call has no idempotency key)
-- ARGV[8]  idempotency hash ("" when none)   ARGV[9] idempotency TTL seconds
-- ARGV[10] max quantity per call             ARGV[11] max hold milliseconds
-- ARGV[12] rejection TTL seconds (how long a rejection replays; minutes)
--
-- The new hold carries the SKU's generation (see sku_gen in lib.lua).
--
-- A SKU of a drop is also held to its drop's sale window and per-person
-- limit: the units the principal holds or bought of every SKU of the drop are
-- summed from their quota hashes, so the drop's count needs no state of its
-- own and is right whatever released, sold or rebuilt any of them.
--
-- Returns hold_reply('OK', ...) on success or replay, or a rejection
-- {code, a, b, replayed}: INVALID_INPUT {field, reason}, IDEMPOTENCY_KEY_REUSED,
-- NEEDS_HYDRATION {sku} (that SKU, or another of its drop, or the drop itself, is not in
-- Redis: rebuild the SKU named from Postgres, which brings its drop too, and retry),
-- SALE_NOT_ACTIVE {starts_ms, ends_ms}, QUOTA_EXCEEDED {limit, already},
-- OUT_OF_STOCK {available}, DRAW_ONLY (the product is sold by draw).
--
-- Why one script: the checks and the deduction must be one step. Anything in
-- between (a GET, then a DECRBY) is a window in which two buyers both see the
-- last unit. Every check runs before the first write, because Redis does not
-- roll a script back. A retried call (same token) replays the hold it made.

local base, sku, who = ARGV[1], ARGV[2], ARGV[3]
local sku_key, hold, quota, idem_rec = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local expiry, outbox, channel = KEYS[5], KEYS[6], KEYS[7]
local token, fp, idem = ARGV[6], ARGV[7], ARGV[8]

-- 1. Validate.
if not is_int(ARGV[4], 1, tonumber(ARGV[10])) then
  return { 'INVALID_INPUT', 'quantity', 'must be between 1 and ' .. ARGV[10], 0 }
end
if not is_int(ARGV[5], 1000, tonumber(ARGV[11])) then
  return { 'INVALID_INPUT', 'holdSeconds', 'out of range', 0 }
end
if sku == '' or who == '' or token == '' then
  return { 'INVALID_INPUT', 'input', 'sku, principal and token are required', 0 }
end
local qty = tonumber(ARGV[4])

-- A retry of this very call (the reply was lost) finds its own hold.
local mine = hash_get(hold)
if mine then
  if mine['who'] ~= who or mine['sku'] ~= sku then
    return { 'INVALID_INPUT', 'token', 'token already used', 0 }
  end
  return hold_reply('OK', token, mine, 1)
end

-- 2. Idempotency: replay the first outcome, refuse a different request.
if fp ~= '' then
  local rec = hash_get(idem_rec)
  if rec then
    if rec['fp'] ~= fp then
      return { 'IDEMPOTENCY_KEY_REUSED', '', '', 1 }
    end
    if rec['code'] == 'OK' then
      local h = hash_get(hold_key(base, rec['tok']))
      if h and h['gen'] == sku_gen(sku_key) then
        return hold_reply('OK', rec['tok'], h, 1)
      end
      -- The hold outlived its retention, or was lost with an earlier life of
      -- the SKU: the request is treated as new.
    else
      return { rec['code'], rec['a'] or '', rec['b'] or '', 1 }
    end
  end
end

-- reject records a business rejection for idempotent replay, then returns it.
-- A rejection lives ARGV[12] seconds, not the idempotency TTL of a hold: every
-- fresh key a client gets refused costs Redis a record, and a short life is
-- what bounds the memory one principal can pin (its mutation rate times this).
local function reject(code, a, b)
  if fp ~= '' then
    redis.call('HSET', idem_rec, 'fp', fp, 'code', code, 'a', tostring(a), 'b', tostring(b))
    redis.call('EXPIRE', idem_rec, ARGV[12])
  end
  return { code, tostring(a), tostring(b), 0 }
end

-- 3. The product must be loaded. It is not cached as a rejection: the caller
-- rebuilds the SKU from Postgres and calls again.
local s = redis.call('HMGET', sku_key, 'avail', 'max', 'start', 'end', 'gen', 'drop', 'draw')
if not s[5] then
  return { 'NEEDS_HYDRATION', sku, '', 0 }
end
if s[7] then
  return reject('DRAW_ONLY', '', '')
end
local avail, max = tonumber(s[1]), tonumber(s[2] or '0')
local starts, ends = tonumber(s[3] or '0'), tonumber(s[4] or '0')

-- 4. Sale window, on Redis' clock: every server agrees on it.
local now = now_ms()
if (starts > 0 and now < starts) or (ends > 0 and now >= ends) then
  return reject('SALE_NOT_ACTIVE', starts, ends)
end

-- 5. Per-principal quota: units held plus units bought.
local already = tonumber(redis.call('HGET', quota, who) or '0')
if max > 0 and already + qty > max then
  return reject('QUOTA_EXCEEDED', max, already)
end

-- 5b. The drop's window and limit, across every SKU of the drop.
if s[6] and s[6] ~= '' then
  local no = drop_check(base, s[6], sku, who, qty, now)
  if no and no[1] == 'NEEDS_HYDRATION' then
    return { 'NEEDS_HYDRATION', no[2], '', 0 }
  elseif no then
    return reject(no[1], no[2], no[3])
  end
end

-- 6. Stock.
if avail < qty then
  return reject('OUT_OF_STOCK', avail, 0)
end

-- 7. Every check passed: write.
local h = {
  sku = sku, who = who, qty = tostring(qty), st = 'HELD', exp = tostring(now + tonumber(ARGV[5])),
  ctd = tostring(now), idem = idem, fp = fp, gen = s[5],
}
redis.call('HSET', hold, 'sku', sku, 'who', who, 'qty', h['qty'], 'st', 'HELD',
  'exp', h['exp'], 'ctd', h['ctd'], 'idem', idem, 'fp', fp, 'gen', s[5])
redis.call('HINCRBY', quota, who, qty)
redis.call('ZADD', expiry, h['exp'], token)
bump_stock(sku_key, -qty, qty, 0, now)
if fp ~= '' then
  redis.call('HSET', idem_rec, 'fp', fp, 'code', 'OK', 'tok', token)
  redis.call('EXPIRE', idem_rec, ARGV[9])
end
emit(outbox, 'reserve', token, h, now)
announce(sku_key, channel, sku)
return hold_reply('OK', token, h, 0)
