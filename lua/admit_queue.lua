-- admit_queue.lua: one step of an admission queue: admit the next tickets, as the stock allows.
--
-- KEYS[1] {p}q:<queue>      the queue's hash (load_queue.lua)
-- KEYS[2] {p}qpre:<queue>   KEYS[3] {p}qnum:<queue>
-- KEYS[4] {p}qpass:<queue>  principal -> "pass|expires_ms|state|number"
-- KEYS[5] {p}qlive:<queue>  principals whose pass is not spent, by expiry (ms)
-- KEYS[6] {p}sku:<sku>      a product's queue: the product's stock hash;
--         {p}drop:<drop>    a drop's queue: the drop's hash
-- KEYS[7] {p}outbox         the partition's event stream: a step that admits is recorded
--                           (qadmit: its numbers, its nonce, its passes' expiry)
-- ARGV[1] partition base, for the keys derived here: a drop's SKUs' stock hashes (the
--         SKUs its hash lists), and the drop's hash and SKUs again in may_take
-- ARGV[2] 'sku' or 'drop'   ARGV[3] the product or drop
-- ARGV[4] nonce: 128 random bits in hex, from which this step's passes are made
-- ARGV[5] most tickets one step admits
--
-- A step that changes what a waiter sees (the status, the last number
-- admitted, the tickets waiting) announces it once, on the queue's sharded
-- channel {p}qchanged:<queue> (queue_publish in lib.lua): one message per
-- step for every waiter, which the live hub fans out (queueChanged).
--
-- Returns {'OK', status, through, next, admitted, unspent, available, seq}:
-- the queue's status (OPEN, PAUSED while every unit is held, SOLD_OUT once
-- every unit is sold, CLOSED once the sale window has ended), the last number
-- admitted, the last number given, how many this step admitted, the passes
-- not spent nor expired, the units available, and the queue's sequence (it
-- rises with every change a waiter can see). {'PRE', seq} before the
-- opening; {'NUMBER', pre, numbered} while the pre-queue's numbers are
-- missing (number_queue.lua); {'NEEDS_LOAD'}; {'NEEDS_HYDRATION', sku}.
--
-- A step admits at most the rate's credit (admissions per minute, earned
-- since the last step, at most 1 s of it), and never so many that the
-- passes not spent nor expired outnumber the units available: an admitted
-- ticket's holder can always find a unit, unless a pass holder ahead of it
-- buys more than one. Whether the queue may hand out a pass at all is
-- may_take's decision on the 'pass' path (lib.lua): the product's mode, its
-- window and its drop's window, the stock. A pass is bound to its
-- principal and queue, lives pass_ms, and is spent by the hold or the join
-- it buys (spend_pass in lib.lua).
--
-- Why one script: counting the unspent passes, reading the stock and handing
-- out new passes must be one step, or a unit could be promised twice.
local q, pre, nums, passes, live, stock, outbox = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local base, kind, id, nonce, most = ARGV[1], ARGV[2], ARGV[3], ARGV[4], tonumber(ARGV[5])
local scope = kind .. ':' .. id
if redis.call('EXISTS', q) == 0 then
  return { 'NEEDS_LOAD' }
end
local now = now_ms()
local state = queue_close(q, pre, now, scope, outbox)
local h = hash_get(q)
if state == 'pre' then
  local seq = tonumber(h['seq'])
  local waiting = redis.call('SCARD', pre)
  local sig = 'PRE_QUEUE 0 ' .. waiting
  if sig ~= h['pub'] then
    seq = redis.call('HINCRBY', q, 'seq', 1)
    queue_publish(base, kind .. ':' .. id, q, sig, 'PRE_QUEUE', 0, waiting, seq, now)
  end
  return { 'PRE', seq }
elseif state == 'numbering' then
  return { 'NUMBER', tonumber(h['pre']), tonumber(h['numbered']) }
end

-- The stock: the product's, or the sum of the drop's SKUs'.
local avail, held = 0, 0
local view = { mode = 'queue', max = 0, starts = 0, ends = 0, free = 0 }
if kind == 'sku' then
  local s = redis.call('HMGET', stock, 'gen', 'avail', 'held', 'start', 'end')
  if not s[1] then
    return { 'NEEDS_HYDRATION', id }
  end
  avail, held = tonumber(s[2]), tonumber(s[3] or '0')
  view.sku, view.starts, view.ends = id, tonumber(s[4] or '0'), tonumber(s[5] or '0')
else
  local list = redis.call('HGET', stock, 'skus')
  if not list then
    return { 'NEEDS_HYDRATION', '' }
  end
  for sku in string.gmatch(list, '%S+') do
    local s = redis.call('HMGET', sku_keys(base, sku).sku, 'gen', 'avail', 'held')
    if not s[1] then
      return { 'NEEDS_HYDRATION', sku }
    end
    avail, held = avail + tonumber(s[2]), held + tonumber(s[3] or '0')
    view.sku = view.sku or sku
  end
  view.drop = id
  if not view.sku then
    return { 'OK', 'PAUSED', tonumber(h['through']), tonumber(h['next']), 0, 0, 0, tonumber(h['seq']) }
  end
end

-- Passes that expired unspent no longer count against the stock.
redis.call('ZREMRANGEBYSCORE', live, '-inf', now)
local unspent = redis.call('ZCARD', live)
local through, last_num = tonumber(h['through']), tonumber(h['next'])
local rate = tonumber(h['rate'])
local cap = math.max(1, rate / 60)
local credit = math.min(cap, tonumber(h['credit']) + math.max(0, now - tonumber(h['last'])) * rate / 60000)

local status = 'OPEN'
if avail == 0 and held == 0 then
  status = 'SOLD_OUT'
elseif avail == 0 then
  status = 'PAUSED'
end
view.free = avail - unspent
local n = math.min(math.floor(credit), last_num - through, most)
local no = may_take('pass', base, view, '', 1, now)
if no then
  n = 0
  if no[1] == 'SALE_NOT_ACTIVE' and tonumber(no[3]) > 0 and now >= tonumber(no[3]) then
    status = 'CLOSED'
  end
else
  n = math.min(n, view.free)
end

local pass_ms = tonumber(h['pass_ms'])
local exp = tostring(now + pass_ms)
for i = 1, n do
  local num = tostring(through + i)
  local who = redis.call('HGET', nums, num)
  if who then
    local pass = string.sub(redis.sha1hex(nonce .. ':' .. num), 1, 32)
    redis.call('HSET', passes, who, pass .. '|' .. exp .. '|A|' .. num)
    redis.call('ZADD', live, exp, who)
  end
end
if n > 0 then
  emit_queue(outbox, 'qadmit', 'qadmit:' .. scope .. ':' .. nonce, scope, now,
    { 'first', tostring(through + 1), 'last', tostring(through + n), 'nonce', nonce, 'exp', exp })
end
through = through + n
local seq = tonumber(h['seq'])
local sig = status .. ' ' .. through .. ' ' .. (last_num - through)
if n > 0 or status ~= h['status'] or sig ~= h['pub'] then
  seq = redis.call('HINCRBY', q, 'seq', 1)
end
redis.call('HSET', q, 'through', through, 'credit', tostring(credit - n), 'last', now, 'status', status)
if sig ~= h['pub'] then
  queue_publish(base, kind .. ':' .. id, q, sig, status, through, last_num - through, seq, now)
end
return { 'OK', status, through, last_num, n, unspent + n, avail, seq }
