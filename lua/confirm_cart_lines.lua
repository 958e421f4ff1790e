-- confirm_cart_lines.lua: phase 2 of a cart, in one partition. Turns the
-- cart's provisional holds of this partition into ordinary holds that last
-- until the cart's expiry, and records them in the ledger.
--
-- KEYS[1]  {p}expiry             HELD tokens by expiry (ms)
-- KEYS[2]  {p}outbox             the partition's event stream
-- then, for each line i (1-based), two keys:
-- KEYS[2i+1] {p}sku:<sku>   KEYS[2i+2] {p}hold:<token>
-- ARGV[1]  the cart's token   ARGV[2] the cart's expiry (ms)
-- then, for each line i, ARGV[i+2] its token
--
-- Returns {'OK'} when every line is confirmed (now, or by an earlier run of
-- this call: a confirmed line is left as it is); {'LATE', token} when a line
-- is no longer a live provisional hold of this cart before its deadline (it
-- was released, expired, or its SKU rebuilt): nothing is written, and the
-- caller lets the whole cart go; {'NEEDS_HYDRATION', sku} when a SKU is not
-- loaded.
--
-- Why one script: the check that every line is still held and the change of
-- their expiry must be one step, or a line could be confirmed after the
-- sweeper released it. A line is confirmed only before its deadline, and the
-- cart sweep abandons a cart only after it: once the deadline has passed, no
-- line of an unfinished cart can gain a longer life.

local cart, exp = ARGV[1], ARGV[2]
local n = #ARGV - 2
if n < 1 or #KEYS ~= 2 + 2 * n then
  return { 'INVALID_INPUT', 'lines', 'keys and lines do not match' }
end
local expiry, outbox = KEYS[1], KEYS[2]
local now = now_ms()
local todo = {}
for i = 1, n do
  local tok, sku_key, hold = ARGV[i + 2], KEYS[2 * i + 1], KEYS[2 * i + 2]
  local h = hash_get(hold)
  local gen = sku_gen(sku_key)
  if h and not gen then
    return { 'NEEDS_HYDRATION', h['sku'] }
  end
  if not h or h['gen'] ~= gen or h['cart'] ~= cart or h['st'] ~= 'HELD' then
    return { 'LATE', tok }
  end
  if h['prov'] == '1' then
    if now >= tonumber(h['exp']) then
      return { 'LATE', tok }
    end
    table.insert(todo, { tok = tok, hold = hold, h = h })
  end
end
for _, l in ipairs(todo) do
  redis.call('HSET', l.hold, 'exp', exp)
  redis.call('HDEL', l.hold, 'prov')
  redis.call('ZADD', expiry, exp, l.tok)
  l.h['exp'] = exp
  l.h['prov'] = nil
  emit(outbox, 'reserve', l.tok, l.h, now)
  if l.h['qp'] then
    -- The admission pass the line spent (hold_cart_lines.lua), recorded now.
    emit_queue(outbox, 'qspend', 'qspend:' .. l.h['qp'] .. ':' .. l.h['who'], l.h['qp'], now,
      { 'who', l.h['who'], 'num', l.h['qn'], 'tok', l.tok })
  end
end
return { 'OK' }
