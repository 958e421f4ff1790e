-- hold_cart_lines.lua: phase 1 of a cart, in one partition. Holds every line
-- of the cart that lives in this partition, provisionally, or none of them.
--
-- KEYS[1]  {p}expiry             HELD tokens by expiry (ms)
-- then, for each line i (1-based), four keys:
-- KEYS[4i-2] {p}sku:<sku>   KEYS[4i-1] {p}hold:<token>   KEYS[4i] {p}quota:<sku>
-- KEYS[4i+1] {p}avail:<sku>
-- ARGV[1]  principal   ARGV[2] the cart's token   ARGV[3] the cart's deadline (ms)
-- ARGV[4]  max quantity per line
-- ARGV[5]  partition base, for the keys derived here: for a line of a SKU of a drop
--          (its stock hash names the drop), the drop's hash and the stock and quota
--          hashes of the drop's SKUs (may_take in lib.lua), as reserve.lua does
-- ARGV[6]  the admission pass presented ("" when none), for lines of a queued product or drop
-- then, for each line i, three values: ARGV[3i+4] sku, ARGV[3i+5] quantity, ARGV[3i+6] token
--
-- A provisional hold is an ordinary HELD hold (its SKU's counters, its quota
-- count and the expiry index count it) with two more fields: cart (the
-- cart's token) and prov = 1. Its expiry is the cart's deadline, a few
-- seconds away, so if the caller dies before confirming it the sweeper
-- releases it then. It emits no ledger event: confirm_cart_lines.lua does,
-- when the cart holds every line (and lib.lua's release emits none for it).
--
-- Each line is asked of may_take (lib.lua) on the 'cart' path, the policy
-- every path that hands out units shares: the product's sale mode must admit
-- a cart (one sold by draw answers DRAW_ONLY), a queued one asks for the
-- buyer's admission pass (pass_check: one pass serves every line of its
-- queue, and holding the lines spends it), then the sale window, the
-- per-person limit, the drop's window and limit, and the stock. The lines of
-- SKUs of one drop all live in the drop's partition, so in this call: each
-- is counted against the drop's limit with the cart's earlier lines of that
-- drop (what the buyer already holds or bought of the drop, plus those lines,
-- plus this one).
--
-- Returns {'OK', replayed} when every line is held (replayed = 1: this very
-- call again); {'REFUSED', n, then n times: line index, code, a, b} with
-- every line that cannot be had, and nothing written: OUT_OF_STOCK {available, 0},
-- QUOTA_EXCEEDED {limit, already}, SALE_NOT_ACTIVE {starts_ms, ends_ms},
-- DRAW_ONLY, QUEUE_REQUIRED, PASS_EXPIRED, PASS_INVALID, INVALID_INPUT {field, reason}; {'LATE'} when the deadline has passed (nothing
-- written: the cart is being abandoned); {'NEEDS_HYDRATION', sku} when a SKU
-- (or a SKU of its drop, or the drop) is not loaded; {'WALK_PENDING', sku}
-- when a line could be had but its SKU's waitlist walk is unfinished (walk
-- in lib.lua: the units may still be a waiter's; nothing written: finish
-- the walk with continue_walk.lua and try again).
--
-- Why one script: the checks of all lines and their deductions must be one
-- step, so a partition's lines are held together or not at all, with no
-- window in which another buyer sees a unit twice. Every check runs before
-- the first write.

local who, cart, deadline = ARGV[1], ARGV[2], tonumber(ARGV[3])
local maxq, base, pass = tonumber(ARGV[4]), ARGV[5], ARGV[6]
local n = (#ARGV - 6) / 3
if n < 1 or n ~= math.floor(n) or #KEYS ~= 1 + 4 * n then
  return { 'INVALID_INPUT', 'lines', 'keys and lines do not match' }
end
local expiry = KEYS[1]

local lines = {}
for i = 1, n do
  local l = { sku = ARGV[3 * i + 4], qty = ARGV[3 * i + 5], tok = ARGV[3 * i + 6],
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
local memo, in_drop = {}, {}
for i = 1, n do
  local l = lines[i]
  local s = redis.call('HMGET', l.k.sku, 'avail', 'gen', 'max', 'start', 'end', 'drop', 'mode', 'walk')
  if not s[2] then
    return { 'NEEDS_HYDRATION', l.sku }
  end
  l.gen = s[2]
  if not is_int(l.qty, 1, maxq) then
    refuse(i, 'INVALID_INPUT', 'quantity', 'must be between 1 and ' .. ARGV[4])
  else
    local qty = tonumber(l.qty)
    local view = sku_view(l.sku, s, 3, l.k.quota, tonumber(s[1]))
    view.pass = pass
    l.view = view
    local earlier = view.drop and (in_drop[view.drop] or 0) or 0
    local no = may_take('cart', base, view, who, qty, now, earlier + qty, memo)
    if no and no[1] == 'NEEDS_HYDRATION' then
      return no
    elseif no then
      refuse(i, no[1], no[2], no[3])
    elseif s[8] then
      -- The units are there, but the SKU's waitlist walk is unfinished
      -- (walk in lib.lua): they may still be a waiter's.
      return { 'WALK_PENDING', l.sku }
    end
    if view.drop then
      in_drop[view.drop] = earlier + qty
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
  -- The pass is spent, not yet recorded: the line keeps which, so a cart that
  -- fails gives it back (return_pass) and one that holds records it.
  local scope, num = spend_pass(base, l.view, who, now)
  if scope then
    redis.call('HSET', l.k.hold, 'qp', scope, 'qn', num)
  end
end
return { 'OK', 0 }
