-- hold_cart_lines.lua: phase 1 of a cart, in one partition. Holds every line
-- of the cart that lives in this partition, provisionally, or none of them.
--
-- KEYS[1]  {p}expiry             HELD tokens by expiry (ms)
-- then, for each line i (1-based), four keys:
-- KEYS[4i-2] {p}sku:<sku>   KEYS[4i-1] {p}hold:<token>   KEYS[4i] {p}quota:<sku>
-- KEYS[4i+1] {p}avail:<sku>
-- ARGV[1]  principal   ARGV[2] the cart's token   ARGV[3] the cart's deadline (ms)
-- ARGV[4]  max quantity per line
-- then, for each line i, three values: ARGV[3i+2] sku, ARGV[3i+3] quantity, ARGV[3i+4] token
--
-- A provisional hold is an ordinary HELD hold (its SKU's counters, its quota
-- count and the expiry index count it) with two more fields: cart (the
-- cart's token) and prov = 1. Its expiry is the cart's deadline, a few
-- seconds away, so if the caller dies before confirming it the sweeper
-- releases it then. It emits no ledger event: confirm_cart_lines.lua does,
-- when the cart holds every line (and lib.lua's release emits none for it).
--
-- Returns {'OK', replayed} when every line is held (replayed = 1: this very
-- call again); {'REFUSED', n, then n times: line index, code, a, b} with
-- every line that cannot be had, and nothing written: OUT_OF_STOCK {available, 0},
-- QUOTA_EXCEEDED {limit, already}, SALE_NOT_ACTIVE {starts_ms, ends_ms},
-- INVALID_INPUT {field, reason} (also for a SKU of a drop: its limit spans
-- the drop's SKUs, which a cart does not check); {'LATE'} when the deadline has passed (nothing
-- written: the cart is being abandoned); {'NEEDS_HYDRATION', sku} when a SKU is
-- not loaded.
--
-- Why one script: the checks of all lines and their deductions must be one
-- step, so a partition's lines are held together or not at all, with no
-- window in which another buyer sees a unit twice. Every check runs before
-- the first write.

local who, cart, deadline = ARGV[1], ARGV[2], tonumber(ARGV[3])
local maxq = tonumber(ARGV[4])
local n = (#ARGV - 4) / 3
if n < 1 or n ~= math.floor(n) or #KEYS ~= 1 + 4 * n then
  return { 'INVALID_INPUT', 'lines', 'keys and lines do not match' }
end
local expiry = KEYS[1]

local lines = {}
for i = 1, n do
  local l = { sku = ARGV[3 * i + 2], qty = ARGV[3 * i + 3], tok = ARGV[3 * i + 4],
    k = { sku = KEYS[4 * i - 2], hold = KEYS[4 * i - 1], quota = KEYS[4 * i], channel = KEYS[4 * i + 1] } }
  lines[i] = l
end

-- This very call again (its reply was lost) finds its holds.
local found = 0
for i = 1, n do
  local h = hash_get(lines[i].k.hold)
  if h then
    if h['cart'] ~= cart or h['who'] ~= who then
      return { 'INVALID_INPUT', 'token', 'token already used' }
    end
    found = found + 1
  end
end
if found == n then
  return { 'OK', 1 }
end

local now = now_ms()
if now >= deadline then
  return { 'LATE' }
end

local refused = {}
local function refuse(i, code, a, b)
  table.insert(refused, i)
  table.insert(refused, code)
  table.insert(refused, tostring(a))
  table.insert(refused, tostring(b))
end
for i = 1, n do
  local l = lines[i]
  local s = redis.call('HMGET', l.k.sku, 'avail', 'max', 'start', 'end', 'gen', 'drop')
  if not s[5] then
    return { 'NEEDS_HYDRATION', l.sku }
  end
  l.gen = s[5]
  if s[6] and s[6] ~= '' then
    -- A drop's limit spans its SKUs; a cart does not check it, so a SKU of
    -- a drop is reserved on its own.
    refuse(i, 'INVALID_INPUT', 'sku', 'a SKU of a drop cannot be in a cart: reserve it on its own')
  elseif not is_int(l.qty, 1, maxq) then
    refuse(i, 'INVALID_INPUT', 'quantity', 'must be between 1 and ' .. ARGV[4])
  else
    local qty = tonumber(l.qty)
    local avail, max = tonumber(s[1]), tonumber(s[2] or '0')
    local starts, ends = tonumber(s[3] or '0'), tonumber(s[4] or '0')
    local already = tonumber(redis.call('HGET', l.k.quota, who) or '0')
    if (starts > 0 and now < starts) or (ends > 0 and now >= ends) then
      refuse(i, 'SALE_NOT_ACTIVE', starts, ends)
    elseif max > 0 and already + qty > max then
      refuse(i, 'QUOTA_EXCEEDED', max, already)
    elseif avail < qty then
      refuse(i, 'OUT_OF_STOCK', avail, 0)
    end
  end
end
if #refused > 0 then
  local out = { 'REFUSED', #refused / 4 }
  for _, v in ipairs(refused) do
    table.insert(out, v)
  end
  return out
end

-- Every line passed: hold them all.
for i = 1, n do
  local l = lines[i]
  local qty = tonumber(l.qty)
  redis.call('HSET', l.k.hold, 'sku', l.sku, 'who', who, 'qty', l.qty, 'st', 'HELD', 'exp', tostring(deadline),
    'ctd', tostring(now), 'idem', '', 'fp', '', 'gen', l.gen, 'cart', cart, 'prov', '1')
  redis.call('HINCRBY', l.k.quota, who, qty)
  redis.call('ZADD', expiry, deadline, l.tok)
  bump_stock(l.k.sku, -qty, qty, 0, now)
  announce(l.k.sku, l.k.channel, l.sku)
end
return { 'OK', 0 }
