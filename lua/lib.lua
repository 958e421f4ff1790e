-- lib.lua: helpers shared by every Dropline script. The Go loader prepends this
-- file to each script, so the scripts stay single atomic units on the server:
-- the definitions the script reaches, in this order (lua/shake.go). Each
-- definition opens on a line of its own starting with "local ".
--
-- Keys. A script receives in KEYS every key its caller can name, in the
-- order its header gives (inventory/keys.go builds them), and the helpers
-- below take those keys as parameters. A script derives a key itself only
-- from data it has just read: the hold an idempotency record points at, the
-- SKU of a hold its caller knows by token only, the holds of a rebuild chunk,
-- the drop a SKU's stock hash names and the SKUs that drop lists, the
-- partition's set of unfinished waitlist walks (walks_key); and in
-- reserve.lua, each request's hold and idempotency record, from the token
-- and hash its arguments carry (an argument costs Redis about what a small
-- command does, and a batch has many).
-- Each such script names that exception in its header and derives through
-- the functions below, which mirror inventory/keys.go. They start from the
-- partition base ("<prefix>{pNN}:", passed in ARGV), so a derived key carries
-- the hash tag of the call's KEYS and stays in its Redis Cluster slot.

-- hold_key is the hash of one hold.
local function hold_key(base, token)
  return base .. 'hold:' .. token
end

-- idem_key is the record of a reserve's first outcome for an idempotency hash.
local function idem_key(base, hash)
  return base .. 'idem:' .. hash
end

-- cart_key is the hash of one cart, in its home partition.
local function cart_key(base, token)
  return base .. 'cart:' .. token
end

-- sku_keys returns the keys of one SKU: its stock hash, its quota hash and
-- its announce channel.
local function sku_keys(base, sku)
  return { sku = base .. 'sku:' .. sku, quota = base .. 'quota:' .. sku, channel = base .. 'avail:' .. sku }
end

-- drop_key is the hash of a drop (max start end ver skus); a drop's SKUs
-- share its partition, so it carries their hash tag.
local function drop_key(base, drop)
  return base .. 'drop:' .. drop
end

-- now_ms is Redis' clock in milliseconds; t, when given, is a reply of TIME
-- the script already has.
local function now_ms(t)
  t = t or redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- The per-principal mutation budget is GCRA, the algorithm of the go-redis
-- redis_rate limiter, counted in whole microseconds: its key holds the
-- theoretical arrival time, in microseconds since 2017 as a decimal integer,
-- and expires once the budget is full again, so every instance and every
-- script agree on one budget. An integer is printed and parsed for a few
-- hundred instructions, where redis_rate's float seconds cost Redis some
-- 4,000 to print with %.17g on every spend. A key an earlier release wrote
-- holds float seconds since 2017 (below 1e11 for millennia, where
-- microseconds passed it on the second day of 2017): rate_check reads
-- either.
--
-- rate_now is Redis' clock as that algorithm counts it, from a TIME reply.
local function rate_now(t)
  return (t[1] - 1483228800) * 1000000 + t[2]
end

-- rate_budget is a budget's emission interval and burst offset in whole
-- microseconds, from its burst, rate and period in seconds: the interval
-- rounded up when a period is not a whole number of microseconds per unit
-- (what the division's rounding leaves above a whole number is not), so a
-- budget never lets through more than its rate, and every step of the
-- arithmetic is exact.
local function rate_budget(burst, rate, period)
  local iv = period * 1000000 / rate
  local whole = iv - iv % 1
  if iv - whole > 1e-6 then
    whole = whole + 1
  end
  return whole, whole * burst
end

-- rate_check says whether cost more mutations (1 when nil) fit the budget
-- at key (interval and offset from rate_budget) at time now (rate_now). It
-- writes nothing: it returns true and the new arrival time and reset delay
-- for rate_spend, or false and how many seconds to wait (a string, as
-- redis_rate answers it). A cost above the burst never fits. The key holds
-- an integer as this release writes it, or float seconds as an earlier one
-- did (below 1e11), read as microseconds rounded up, never earlier than
-- they were.
local function rate_check(key, interval, offset, now, cost)
  local tat = redis.call('GET', key)
  if tat then
    -- Arithmetic converts the text once; tonumber converts it twice.
    tat = tat + 0
    if tat < 1e11 then
      tat = math.ceil(tat * 1000000)
    end
    if tat < now then
      tat = now
    end
  else
    tat = now
  end
  local new_tat = tat + interval * (cost or 1)
  local diff = now - (new_tat - offset)
  if diff < 0 then
    return false, tostring(-diff / 1000000)
  end
  return true, new_tat, new_tat - now
end

-- rate_spend records a mutation rate_check allowed: the arrival time as an
-- integer, and the key's life in whole seconds, both printed by
-- string.format (Redis prints a Lua number it is given with %.17g, which
-- costs more than the SET itself). texts, when given, is a table the caller
-- keeps for one run: the life's text by its seconds, so that a run spending
-- many budgets of one rate prints each life once.
local function rate_spend(key, new_tat, reset_after, texts)
  if reset_after > 0 then
    local ex = math.ceil(reset_after / 1000000)
    local t = texts and texts[ex]
    if not t then
      t = string.format('%d', ex)
      if texts then
        texts[ex] = t
      end
    end
    redis.call('SET', key, string.format('%d', new_tat), 'EX', t)
  end
end

-- is_int reports whether s is a decimal integer within [lo, hi]: it returns
-- the number when it is (a true value, 0 included), false when not.
local function is_int(s, lo, hi)
  if type(s) ~= 'string' or not string.match(s, '^%-?%d+$') or #s > 15 then
    return false
  end
  local n = tonumber(s)
  return n >= lo and n <= hi and n
end

-- count returns the number a small count's text (0 to 64) is, as tonumber
-- would, by looking it up in small_counts: tonumber calls C's strtod, about
-- 800 instructions for a digit. The table is made once when the script
-- runs as a function (its library's top level runs when it is loaded, where
-- Redis gives it no tostring: the concatenation prints the number).
local small_counts = {}
for i = 0, 64 do
  small_counts['' .. i] = i
end

local function count(s)
  return small_counts[s] or tonumber(s)
end

-- hash_get returns the fields of a hash as a table, or nil when it is absent.
local function hash_get(key)
  local raw = redis.call('HGETALL', key)
  if #raw == 0 then
    return nil
  end
  local h = {}
  for i = 1, #raw, 2 do
    h[raw[i]] = raw[i + 1]
  end
  return h
end

-- now_us is Redis' clock in microseconds, as a string (exact beyond 2^53).
local function now_us()
  local t = redis.call('TIME')
  return t[1] .. string.format('%06d', tonumber(t[2]))
end

-- sku_gen returns the generation of the SKU's current life in Redis, or nil
-- when the SKU is not loaded. Every rebuild starts a new generation, and a
-- hold counts only if it carries the generation of the SKU it belongs to: a
-- hold left over from an earlier life (after keys were lost one by one, as
-- eviction would) can never move units it was never counted in.
local function sku_gen(sku_key)
  return redis.call('HGET', sku_key, 'gen')
end

-- outside says whether now falls outside the window starts..ends (ms; 0 is
-- an open bound).
local function outside(now, starts, ends)
  return (starts > 0 and now < starts) or (ends > 0 and now >= ends)
end

-- drop_of reads what a decision needs of a drop: {max, starts, ends, list}
-- (list: its SKUs, at most 100, as the drop's hash lists them), or nil when
-- the drop is not loaded. memo, a table the caller keeps for one script run,
-- keeps it for the rest of the run (nothing a run does changes a drop).
local function drop_of(base, drop, memo)
  local d = memo and memo['drop:' .. drop]
  if d then
    return d
  end
  local r = redis.call('HMGET', drop_key(base, drop), 'max', 'start', 'end', 'skus')
  if not r[4] then
    return nil
  end
  d = { max = tonumber(r[1]), starts = tonumber(r[2]), ends = tonumber(r[3]), list = r[4] }
  if memo then
    memo['drop:' .. drop] = d
  end
  return d
end

-- drop_quotas returns the quota hashes of the drop d's SKUs, or nil and the
-- SKU to rebuild when one of them is not loaded (the buyer's count would be
-- missing its units) or when the drop's copy does not list sku yet (its
-- rebuild brings the drop up to date). memo keeps the list for the run.
local function drop_quotas(base, d, sku, memo)
  local q = memo and memo['quotas:' .. sku]
  if q then
    return q
  end
  q = {}
  local listed = false
  for other in string.gmatch(d.list, '%S+') do
    local k = sku_keys(base, other)
    if other == sku then
      listed = true
    elseif not sku_gen(k.sku) then
      return nil, other
    end
    q[#q + 1] = k.quota
  end
  if not listed then
    return nil, sku
  end
  if memo then
    memo['quotas:' .. sku] = q
  end
  return q
end

-- The admission queue of a queued product, or of the drop a queued SKU is
-- in (inventory/queue builds the same keys): queue_scope names it, and its
-- passes are a hash by principal of "id|expires_ms|state|number" (state A:
-- not spent yet, U: spent by a hold or a join) and a sorted set of the
-- principals whose pass is not spent, by expiry (what the admission counts
-- against the free units).
local function queue_scope(s)
  if s.drop then
    return 'drop:' .. s.drop
  end
  return 'sku:' .. s.sku
end

local function pass_keys(base, scope)
  return { passes = base .. 'qpass:' .. scope, live = base .. 'qlive:' .. scope }
end

-- pass_check is the admission pass limit: s.pass is the pass who presents
-- ('' or nil: none). Returns nil for the principal's own pass, not spent,
-- not expired, else a refusal QUEUE_REQUIRED, PASS_INVALID or PASS_EXPIRED
-- (policy.PassState).
local function pass_check(base, s, who, now)
  if not s.pass or s.pass == '' then
    return { 'QUEUE_REQUIRED', '', '' }
  end
  local raw = redis.call('HGET', pass_keys(base, queue_scope(s)).passes, who)
  local id, exp, st = string.match(raw or '', '^([^|]+)|(%d+)|(%a)|')
  if not id or id ~= s.pass or st ~= 'A' then
    return { 'PASS_INVALID', '', '' }
  end
  if tonumber(exp) <= now then
    return { 'PASS_EXPIRED', '', '' }
  end
  return nil
end

-- emit_queue appends an admission queue's event to its partition's outbox:
-- kind (qjoin, qclose, qnum, qadmit, qspend), its id (which names what
-- happened, so the ledger applies it once), the queue's scope, and the
-- kind's own fields as name, value pairs (db.Event's queue fields).
local function emit_queue(outbox, kind, id, scope, now, fields)
  -- No v: version 1, as emit_event's (see there).
  local args = { 'id', id, 'type', kind, 'q', scope, 'at', tostring(now) }
  for _, v in ipairs(fields) do
    args[#args + 1] = v
  end
  redis.call('XADD', outbox, '*', unpack(args))
end

-- spend_pass marks who's pass spent, once a path held to the pass limit has
-- written what it bought (a hold, or a waitlist entry): a pass buys one.
-- Nothing when the SKU's mode takes no pass. With an outbox, the spending
-- is recorded (a qspend event; bought names the hold's token, or the
-- waitlist place); without, it is not yet: a cart's provisional line
-- (hold_cart_lines.lua) records it when confirm_cart_lines.lua confirms the
-- line, and gives the pass back if the cart fails (return_pass). Returns the
-- queue's scope and the ticket's number when this call spent the pass.
local function spend_pass(base, s, who, now, bought, outbox)
  if not policy_pass[s.mode or 'first_come'] then
    return nil
  end
  local scope = queue_scope(s)
  local k = pass_keys(base, scope)
  local raw = redis.call('HGET', k.passes, who)
  local num
  if raw then
    local spent, n = string.gsub(raw, '^([^|]+|%d+|)A|', '%1U|')
    if n == 1 then
      redis.call('HSET', k.passes, who, spent)
      num = string.match(raw, '|(%d+)$')
      if outbox then
        emit_queue(outbox, 'qspend', 'qspend:' .. scope .. ':' .. who, scope, now,
          { 'who', who, 'num', num or '0', 'tok', bought or '' })
      end
    end
  end
  redis.call('ZREM', k.live, who)
  if num then
    return scope, num
  end
  return nil
end

-- return_pass gives back the pass a cart's provisional line spent (the
-- hold's fields qp, its queue's scope, and qn, the ticket's number) when the
-- line is released before its cart held every line: the cart failed, and
-- the pass it never used is the principal's again, until its expiry, as if
-- unspent (the spending was never recorded). outbox is the partition's
-- stream key, whose base the queue's keys share.
local function return_pass(outbox, h)
  local k = pass_keys(string.sub(outbox, 1, -7), h['qp'])
  local raw = redis.call('HGET', k.passes, h['who'])
  local exp, num = string.match(raw or '', '^[^|]+|(%d+)|U|(%d+)$')
  if exp and num == h['qn'] then
    redis.call('HSET', k.passes, h['who'], (string.gsub(raw, '^([^|]+|%d+|)U|', '%1A|')))
    redis.call('ZADD', k.live, exp, h['who'])
  end
end

-- queue_close closes a queue's pre-queue once its opening time has come: the
-- pre-queue's size is frozen (its members get numbers 1..pre from the
-- shuffle, number_queue.lua) and later joins are numbered after it. q is the
-- queue's hash, pre its pre-queue set, scope the queue's id and outbox its
-- partition's stream (the closing is recorded: a qclose event with the
-- size). Returns the queue's state after: 'pre' (not open yet), 'numbering'
-- (the shuffle's numbers are being written) or 'open'.
local function queue_close(q, pre, now, scope, outbox)
  local h = redis.call('HMGET', q, 'opens', 'state')
  if h[2] == 'pre' and now >= tonumber(h[1]) then
    local n = redis.call('SCARD', pre)
    local state = n > 0 and 'numbering' or 'open'
    redis.call('HSET', q, 'state', state, 'pre', n, 'next', n, 'numbered', 0, 'seq', redis.call('HINCRBY', q, 'seq', 1))
    emit_queue(outbox, 'qclose', 'qclose:' .. scope, scope, now, { 'num', tostring(n) })
    return state
  end
  return h[2]
end

-- queue_publish announces a queue's state to its sharded channel
-- (base .. 'qchanged:' .. queue), one message for every waiter, and records
-- sig (status, through, waiting) as the last state announced, so a step
-- that changes nothing a waiter sees announces nothing. The live hub takes
-- the message as a hint with a sequence number, like a stock message.
local function queue_publish(base, queue, q, sig, status, through, waiting, seq, now)
  redis.call('HSET', q, 'pub', sig)
  redis.call('SPUBLISH', base .. 'qchanged:' .. queue, string.format(
    '{"queue":%s,"status":"%s","through":%s,"waiting":%s,"seq":%s,"at":%s}',
    cjson.encode(queue), status, tostring(through), tostring(waiting), tostring(seq), tostring(now)))
end

-- may_take is the one decision of who may take units of a SKU, which every
-- script that hands units out (reserve.lua, hold_cart_lines.lua, handoff
-- below, apply_draw.lua) and join_waitlist.lua ask before they write. It
-- follows the policy rendered above from package inventory/policy: the
-- SKU's sale mode must admit the path (policy_admits, else the mode's
-- policy_refusal), then each limit of the path is checked in order
-- (policy_limits). inventory/policy's Check decides the same way.
--
-- path is the path's name ('reserve', 'cart', 'offer', 'draw', 'join',
-- 'pass'); s the SKU as the caller has it: sku, mode, max, starts, ends, drop
-- (nil for none), quota (its quota hash), free (the units this path may take
-- from) and pass (the admission pass presented, for a queued SKU: see
-- pass_check); who, qty the buyer and the units asked; drop_qty (default qty) the
-- units counted against the drop (a cart counts its earlier lines of the
-- drop too); memo a table kept for one script run, or nil.
--
-- Returns nil when the path may take the units; else a refusal {code, a, b}:
-- the mode's own, QUEUE_REQUIRED, PASS_EXPIRED or PASS_INVALID (a queued
-- SKU's pass), SALE_NOT_ACTIVE {starts_ms, ends_ms} (the SKU's or its
-- drop's window), QUOTA_EXCEEDED {limit, already} (the SKU's or its drop's
-- per-person limit: already is what the buyer holds or bought), OUT_OF_STOCK
-- {free, 0}; or {'NEEDS_HYDRATION', sku} when the drop or a SKU of it is not
-- loaded (rebuild that SKU, which brings its drop, and ask again).
local function may_take(path, base, s, who, qty, now, drop_qty, memo)
  local mode = s.mode or 'first_come'
  local admits = policy_admits[mode]
  if not (admits and admits[path]) then
    local r = policy_refusal[mode] or policy_refusal['first_come']
    return { r[1], r[2], r[3] }
  end
  local d
  local limits = policy_limits[path]
  for li = 1, #limits do
    local limit = limits[li]
    if limit == 'pass' then
      if policy_pass[mode] then
        local no = pass_check(base, s, who, now)
        if no then
          return no
        end
      end
    elseif limit == 'window' then
      if outside(now, s.starts, s.ends) then
        return { 'SALE_NOT_ACTIVE', s.starts, s.ends }
      end
    elseif limit == 'sku_limit' then
      if s.max > 0 then
        local already = tonumber(redis.call('HGET', s.quota, who) or '0')
        if already + qty > s.max then
          return { 'QUOTA_EXCEEDED', s.max, already }
        end
      end
    elseif limit == 'stock' then
      if s.free < qty then
        return { 'OUT_OF_STOCK', s.free, 0 }
      end
    elseif s.drop then
      d = d or drop_of(base, s.drop, memo)
      if not d then
        return { 'NEEDS_HYDRATION', s.sku }
      end
      if limit == 'drop_window' then
        if outside(now, d.starts, d.ends) then
          return { 'SALE_NOT_ACTIVE', d.starts, d.ends }
        end
      else -- drop_limit: the buyer's units of every SKU of the drop
        local quotas, missing = drop_quotas(base, d, s.sku, memo)
        if not quotas then
          return { 'NEEDS_HYDRATION', missing }
        end
        local held = 0
        for _, q in ipairs(quotas) do
          held = held + tonumber(redis.call('HGET', q, who) or '0')
        end
        if held + (drop_qty or qty) > d.max then
          return { 'QUOTA_EXCEEDED', d.max, held }
        end
      end
    end
  end
  return nil
end

-- sku_view is a SKU's stock hash fields as may_take reads them, from an
-- HMGET of 'max', 'start', 'end', 'drop', 'mode' (r, from position i); quota
-- is its quota hash, free the units the caller's path may take from.
local function sku_view(sku, r, i, quota, free)
  local drop, mode = r[i + 3], r[i + 4]
  return { sku = sku, max = tonumber(r[i] or '0'), starts = tonumber(r[i + 1] or '0'), ends = tonumber(r[i + 2] or '0'),
    drop = (drop and drop ~= '') and drop or nil, mode = (mode and mode ~= '') and mode or nil, quota = quota,
    free = free }
end

-- announce publishes a SKU's stock to its sharded channel. Subscribers treat
-- the message as a hint with a sequence number; correctness never depends on it.
-- The JSON is built by hand: cjson prints numbers with 14 significant digits,
-- and seq (it starts at the rebuild's time in microseconds) has 16.
-- sku_key is the SKU's stock hash, channel its announce channel.
-- publish_stock sends the message itself, from the counters as strings;
-- announce reads them from the hash, reserve.lua from its run's copy.
local function publish_stock(channel, sku, total, avail, held, sold, seq, at)
  redis.call('SPUBLISH', channel, string.format(
    '{"sku":%s,"total":%s,"available":%s,"held":%s,"sold":%s,"seq":%s,"at":%s}',
    cjson.encode(sku), total, avail, held, sold, seq, at))
end

local function announce(sku_key, channel, sku)
  local s = redis.call('HMGET', sku_key, 'total', 'avail', 'held', 'sold', 'seq', 'upd')
  publish_stock(channel, sku, s[1], s[2], s[3], s[4], s[5], s[6])
end

-- bump_stock moves units between the SKU's counters and records the change.
local function bump_stock(key, d_avail, d_held, d_sold, now)
  if d_avail ~= 0 then redis.call('HINCRBY', key, 'avail', d_avail) end
  if d_held ~= 0 then redis.call('HINCRBY', key, 'held', d_held) end
  if d_sold ~= 0 then redis.call('HINCRBY', key, 'sold', d_sold) end
  redis.call('HINCRBY', key, 'seq', 1)
  redis.call('HSET', key, 'upd', now)
end

-- emit appends one ledger event to the partition's outbox stream. The event id
-- is derived from what happened, so the ledger can apply it idempotently. gen
-- is the generation of the SKU the hold lived in: the write-behind worker
-- compares it with the SKU's generation after writing the event, to tell a
-- SKU rebuilt from a ledger that did not have the event yet what it says now.
-- ext is how many times the hold was extended, so the ledger keeps the
-- latest expiry whatever order events arrive in. id is the event's id when
-- kind alone does not make it unique (each extension of a hold is its own).
--
-- emit_event writes the event from its fields as strings: emit takes them
-- from a hold's hash, reserve.lua from the hold it has just written.
--
-- tp, when given and not empty, is the W3C traceparent of the request that
-- caused the event (reserve.lua passes it for a traced reserve): the
-- write-behind continues that trace when it records the event. A version
-- that does not know the field ignores it.
--
-- v, the entry's version (inventory.EventVersion), is left out: every
-- reader (inventory.ParseEvent, of this release and the one before) takes
-- an entry without it as version 1, which is the version written here, and
-- one field fewer is some 1,100 instructions of every XADD. A release that
-- writes a newer version puts it in every entry it writes (emit_queue's,
-- emit_wait's and emit_event's), and a reader refuses an entry newer than
-- it reads.
--
-- idem and fp are left out when empty, and ext when '0': a reader takes a
-- missing field as empty, or 0 (inventory.ParseEvent, of every version), so
-- the common entry (no idempotency key, never extended) is three fields
-- shorter, which Redis pays for in every XADD and every read of it.

local function emit_event(outbox, id, kind, token, sku, who, qty, exp, ctd, at, idem, fp, gen, ext, tp)
  local traced = tp and tp ~= ''
  if idem == '' and fp == '' and ext == '0' then
    if traced then
      redis.call('XADD', outbox, '*',
        'id', id, 'type', kind, 'tok', token, 'sku', sku, 'who', who,
        'qty', qty, 'exp', exp, 'ctd', ctd, 'at', at, 'gen', gen, 'tp', tp)
      return
    end
    redis.call('XADD', outbox, '*',
      'id', id, 'type', kind, 'tok', token, 'sku', sku, 'who', who,
      'qty', qty, 'exp', exp, 'ctd', ctd, 'at', at, 'gen', gen)
    return
  end
  if traced then
    redis.call('XADD', outbox, '*',
      'id', id, 'type', kind, 'tok', token, 'sku', sku, 'who', who,
      'qty', qty, 'exp', exp, 'ctd', ctd, 'at', at,
      'idem', idem, 'fp', fp, 'gen', gen, 'ext', ext, 'tp', tp)
    return
  end
  redis.call('XADD', outbox, '*',
    'id', id, 'type', kind, 'tok', token, 'sku', sku, 'who', who,
    'qty', qty, 'exp', exp, 'ctd', ctd, 'at', at,
    'idem', idem, 'fp', fp, 'gen', gen, 'ext', ext)
end

local function emit(outbox, kind, token, h, now, id)
  emit_event(outbox, id or (kind .. ':' .. token), kind, token, h['sku'], h['who'], h['qty'], h['exp'], h['ctd'],
    tostring(now), h['idem'] or '', h['fp'] or '', h['gen'] or '', h['ext'] or '0')
end

-- release returns a HELD hold's units to the SKU. Callers have checked that the
-- hold is HELD; status is CANCELLED or EXPIRED. k names the keys it touches:
-- hold, sku, quota, channel, expiry, committing, outbox.
--
-- retention is how long the finished hold's hash is kept, in seconds.
--
-- A provisional hold (prov = 1: a cart line its cart has not confirmed yet,
-- see hold_cart_lines.lua) never reached the ledger, so its release emits no
-- event either; release_hold.lua keeps its hash only as long as a refusal.
local function release(k, token, h, status, now, retention)
  local qty = tonumber(h['qty'])
  local provisional = h['prov'] == '1'
  redis.call('HSET', k.hold, 'st', status, 'end', now)
  redis.call('EXPIRE', k.hold, retention)
  redis.call('ZREM', k.expiry, token)
  redis.call('ZREM', k.committing, token)
  if redis.call('HINCRBY', k.quota, h['who'], -qty) <= 0 then
    redis.call('HDEL', k.quota, h['who'])
  end
  bump_stock(k.sku, qty, -qty, 0, now)
  h['st'] = status
  h['end'] = tostring(now)
  if not provisional then
    emit(k.outbox, status == 'CANCELLED' and 'cancel' or 'expire', token, h, now)
  elseif h['qp'] then
    return_pass(k.outbox, h)
  end
  announce(k.sku, k.channel, h['sku'])
end

-- hold_reply is the common reply for a hold:
-- {code, token, sku, who, qty, status, expires_ms, created_ms, committed_ms, ended_ms, replayed,
--  extensions}.
local function hold_reply(code, token, h, replayed)
  return { code, token, h['sku'], h['who'], tonumber(h['qty']), h['st'], tonumber(h['exp']),
    tonumber(h['ctd']), tonumber(h['cmt'] or '0'), tonumber(h['end'] or '0'), replayed,
    tonumber(h['ext'] or '0') }
end

-- holder_hold reads a hold its caller knows by token only and checks that
-- who holds it, for the scripts only the holder may run (begin_commit.lua,
-- extend_hold.lua). It returns the hold and its SKU's keys (sku_keys, built
-- from the SKU the hold names), or, when the script must stop, a third value,
-- its reply: {'NOT_FOUND'} when Redis has no such hold in its SKU's current
-- life, {'NEEDS_HYDRATION', sku} when the SKU is not loaded, FORBIDDEN when
-- another principal holds it. It reads what the scripts read themselves, no
-- more.
local function holder_hold(base, hold, token, who)
  local h = hash_get(hold)
  if not h then
    return nil, nil, { 'NOT_FOUND' }
  end
  local k = sku_keys(base, h['sku'])
  local gen = sku_gen(k.sku)
  if not gen then
    return nil, nil, { 'NEEDS_HYDRATION', h['sku'] }
  end
  if h['gen'] ~= gen then
    return nil, nil, { 'NOT_FOUND' }
  end
  if h['who'] ~= who then
    return nil, nil, hold_reply('FORBIDDEN', token, h, 0)
  end
  return h, k
end


-- The waitlist. A SKU's waiters are a sorted set of WAITING principals by
-- their entry's seq (the queue) and a hash of every entry by principal (the
-- entries; the field '#seq' is the last seq handed out, and a principal never
-- starts with '#'). An entry is "seq|qty|hold_ms|status|token|joined_ms" with
-- status W (WAITING) or O (OFFERED: token names the HELD reservation it was
-- handed); a left entry is deleted.

-- wait_keys returns the waitlist keys of a SKU, for scripts that know the SKU
-- only from a hold they read.
local function wait_keys(base, sku)
  return { queue = base .. 'wait:' .. sku, entries = base .. 'waiters:' .. sku }
end

-- wait_entry decodes an entry, or returns nil.
local function wait_entry(raw)
  if not raw then
    return nil
  end
  local seq, qty, hold, st, tok, joined = string.match(raw, '^(%d+)|(%d+)|(%d+)|(%a)|([^|]*)|(%d+)$')
  if not seq then
    return nil
  end
  return { seq = seq, qty = tonumber(qty), hold = tonumber(hold), st = st, tok = tok, joined = joined }
end

local function wait_encode(e)
  return e.seq .. '|' .. e.qty .. '|' .. e.hold .. '|' .. e.st .. '|' .. e.tok .. '|' .. e.joined
end

-- emit_wait appends a waitlist event (wjoin, wleave, woffer) to the outbox.
-- Its id names the entry (SKU and seq), so the ledger applies it once.
local function emit_wait(outbox, kind, sku, who, e, now)
  redis.call('XADD', outbox, '*',
    'id', kind .. ':' .. sku .. ':' .. e.seq, 'type', kind, 'tok', e.tok, 'sku', sku, 'who', who,
    'qty', tostring(e.qty), 'exp', '0', 'ctd', e.joined, 'at', tostring(now), 'idem', '', 'fp', '', 'gen', '',
    'wseq', e.seq, 'hold', tostring(e.hold))
end

-- wait_reply is the common reply for an entry:
-- {code, sku, who, seq, qty, hold_ms, status, token, position, joined_ms, replayed};
-- status W, O or L (left), position 0 unless WAITING.
local function wait_reply(code, queue, sku, who, e, replayed)
  if not e then
    return { code, sku, who, 0, 0, 0, 'L', '', 0, 0, replayed }
  end
  local pos = 0
  if e.st == 'W' then
    pos = (redis.call('ZRANK', queue, who) or -1) + 1
  end
  return { code, sku, who, tonumber(e.seq), e.qty, e.hold, e.st, e.tok, pos, tonumber(e.joined), replayed }
end

local token_alphabet = 'abcdefghijklmnopqrstuvwxyz234567'
local hex_bits = {
  ['0'] = '0000', ['1'] = '0001', ['2'] = '0010', ['3'] = '0011', ['4'] = '0100', ['5'] = '0101',
  ['6'] = '0110', ['7'] = '0111', ['8'] = '1000', ['9'] = '1001', a = '1010', b = '1011',
  c = '1100', d = '1101', e = '1110', f = '1111',
}

-- offer_token makes the token of the i-th hold a script hands to a waiter, in
-- the shape of inventory/token.go ("r07." and 26 base32 characters of 128
-- bits): the bits are the first half of SHA-1(nonce:i), and the nonce is 128
-- random bits the caller drew for this call, so tokens stay unguessable and a
-- script run twice with the same arguments makes the same ones.
local function offer_token(base, nonce, i)
  local bits = string.gsub(string.sub(redis.sha1hex(nonce .. ':' .. i), 1, 32), '.', hex_bits) .. '00'
  local out = {}
  for j = 1, 130, 5 do
    local n = tonumber(string.sub(bits, j, j + 4), 2)
    out[#out + 1] = string.sub(token_alphabet, n + 1, n + 1)
  end
  return 'r' .. string.match(base, '{p(%d%d)}:$') .. '.' .. table.concat(out)
end

-- give_hold makes a HELD hold of qty units of sku for who, under token, for
-- hold_ms, in the SKU's generation gen: the hold's hash, the buyer's quota
-- count, the expiry index, the counters and the reserve event. wseq, when
-- given, is the waitlist entry it was handed to. Callers have asked may_take.
-- k names the keys: sku, quota, expiry, outbox.
local function give_hold(k, base, token, sku, who, qty, hold_ms, gen, now, wseq)
  local h = {
    sku = sku, who = who, qty = tostring(qty), st = 'HELD', exp = tostring(now + hold_ms),
    ctd = tostring(now), idem = '', fp = '', gen = gen,
  }
  redis.call('HSET', hold_key(base, token), 'sku', sku, 'who', who, 'qty', h['qty'], 'st', 'HELD',
    'exp', h['exp'], 'ctd', h['ctd'], 'idem', '', 'fp', '', 'gen', gen)
  if wseq then
    redis.call('HSET', hold_key(base, token), 'wseq', wseq)
  end
  redis.call('HINCRBY', k.quota, who, qty)
  redis.call('ZADD', k.expiry, h['exp'], token)
  bump_stock(k.sku, -qty, qty, 0, now)
  emit(k.outbox, 'reserve', token, h, now)
end

-- The walk. Handing units to waiters means walking the queue in join order
-- until the units are gone; a long queue whose waiters do not fit (they ask
-- for more than is free, or are over a limit) would be walked whole, in one
-- script, blocking Redis. So one script run does at most walk_budget units
-- of work, about a microsecond each: an entry examined costs 3 (reading and
-- decoding it), plus 1 per quota hash may_take reads for it (about 100 for a
-- SKU of a 100-SKU drop), plus 15 for an offer (the hold, the entry and
-- their events); about 80 plain entries, or 2 of such a drop, per run,
-- a quarter of a millisecond on an idle Redis (a run of twice that took
-- 12 ms on a loaded 2-core machine). A walk left unfinished records where it stopped in the SKU's
-- stock hash: 'walk', the seq (score) of the last entry it examined ('0'
-- before the first), and 'walkq', the smallest quantity it passed over for
-- want of units ('' for none). The SKU is then in the partition's set of
-- unfinished walks (walks_key, by when it was left, ms), and the worker
-- group's walk sweep (continue_walk.lua) takes it on from there, run after
-- run, until it ends.
--
-- While a SKU's walk is unfinished its available units may still be a
-- waiter's: reserve.lua and hold_cart_lines.lua answer WALK_PENDING instead
-- of taking them (their caller finishes the walk, then asks again), and a
-- join goes on with the walk instead of being served ahead of it. So no unit
-- is taken past a waiter ahead that could take it, and no one is told
-- OUT_OF_STOCK while a unit is only waiting for the walk to pass everyone by.
local walk_budget = 250

-- walks_key is the partition's set of SKUs whose walk is unfinished.
local function walks_key(base)
  return base .. 'walks'
end

-- walk gives a SKU's available units to its WAITING entries in join order,
-- from the entry after seq after ('0': the head), within walk_budget: each
-- waiter whom may_take lets take its quantity on the 'offer' path (it fits
-- what is left, its limits allow) gets a HELD hold of the duration it chose,
-- and its entry becomes OFFERED; the others are passed over, not removed.
-- minq is the smallest quantity the walk passed over for want of units in
-- its earlier runs (nil for none); had says the SKU has walk state to clear.
-- The walk ends when no unit is left, the queue is walked to its end, or at a
-- refusal no waiter can escape (the window, the mode, a drop not loaded):
-- then units no waiter took are available to everyone. Otherwise it records
-- where it stopped (see above). k names the keys: sku, quota, expiry,
-- outbox, channel, queue, entries; base is the partition base (for the
-- holds' keys and walks_key) and nonce the caller's random string
-- (offer_token). Returns the number of offers and whether the walk is left
-- unfinished.
local function walk(k, base, sku, nonce, now, after, minq, had)
  local s = redis.call('HMGET', k.sku, 'avail', 'gen', 'max', 'start', 'end', 'drop', 'mode')
  if not s[2] then
    return 0, false
  end
  local view = sku_view(sku, s, 3, k.quota, tonumber(s[1]))
  local memo = {}
  local offers, made, cost = 0, 0, 0
  local function quota_reads()
    local q = memo['quotas:' .. sku]
    return q and #q or 0
  end
  while view.free > 0 and cost < walk_budget do
    local batch = redis.call('ZRANGEBYSCORE', k.queue, '(' .. after, '+inf', 'WITHSCORES', 'LIMIT', 0, 64)
    if #batch == 0 then
      break
    end
    for i = 1, #batch, 2 do
      local who = batch[i]
      after = batch[i + 1]
      cost = cost + 3
      local e = wait_entry(redis.call('HGET', k.entries, who))
      if not e or e.st ~= 'W' then
        redis.call('ZREM', k.queue, who) -- not waiting: cannot be in the queue
      elseif e.qty > view.free then
        minq = math.min(minq or e.qty, e.qty) -- passed over: more than is free
      else
        local no = may_take('offer', base, view, who, e.qty, now, nil, memo)
        cost = cost + 1 + quota_reads()
        if not no then
          local token
          repeat
            made = made + 1
            token = offer_token(base, nonce, made)
          until redis.call('EXISTS', hold_key(base, token)) == 0
          give_hold(k, base, token, sku, who, e.qty, e.hold, s[2], now, e.seq)
          e.st, e.tok = 'O', token
          redis.call('HSET', k.entries, who, wait_encode(e))
          redis.call('ZREM', k.queue, who)
          emit_wait(k.outbox, 'woffer', sku, who, e, now)
          view.free = view.free - e.qty
          offers = offers + 1
          cost = cost + 15 -- the hold, the entry, their events
        elseif no[1] ~= 'QUOTA_EXCEEDED' and no[1] ~= 'OUT_OF_STOCK' then
          view.free = 0 -- no waiter can take anything now
        end -- else over a limit: passed over
      end
      if view.free <= 0 or cost >= walk_budget then
        break
      end
    end
  end
  local pending = view.free > 0 and #redis.call('ZRANGEBYSCORE', k.queue, '(' .. after, '+inf', 'LIMIT', 0, 1) > 0
  if pending then
    redis.call('HSET', k.sku, 'walk', after, 'walkq', minq and tostring(minq) or '')
    redis.call('ZADD', walks_key(base), 'NX', now, sku)
  elseif had then
    redis.call('HDEL', k.sku, 'walk', 'walkq')
    redis.call('ZREM', walks_key(base), sku)
  end
  if offers > 0 then
    announce(k.sku, k.channel, sku)
  end
  return offers, pending
end

-- handoff gives a SKU's available units to its waiters, in the order they
-- joined (walk, above). Every script that makes units available
-- (release_hold.lua, begin_commit.lua on a hold past its expiry,
-- finish_commit.lua when the ledger refuses a sale or has the hold as
-- finished, reconcile_hold.lua releasing a hold the ledger has as finished,
-- apply_product.lua, publish_sku.lua, apply_draw.lua once it has queued a
-- draw's losers) calls it after its own writes, in the same script: no
-- reserve can take a freed unit while a waiter could. A new release path
-- calls it the same way. Nothing is handed out outside the sale window. k,
-- base and nonce are walk's; who is the principal whose hold the caller
-- released, or nil when the caller changed the SKU itself (stock, limits,
-- window, a rebuild): then the walk starts again from the head.
--
-- A walk left unfinished goes on from where it stopped when nothing the
-- caller did can make an entry it passed over fit: the units now free are
-- fewer than the smallest quantity it passed over for want of units, and
-- the released hold's principal is not a waiter it passed over (whose limit
-- the release may have made room in). Otherwise it starts again from the
-- head, so every waiter that fits is still served in join order. Returns
-- the number of offers made in this run.
local function handoff(k, base, sku, nonce, now, who)
  if redis.call('ZCARD', k.queue) == 0 then
    return 0
  end
  local w = redis.call('HMGET', k.sku, 'walk', 'walkq', 'avail')
  local after, minq = '0', nil
  if w[1] and who then
    local q = tonumber(w[2] or '')
    local mine = wait_entry(redis.call('HGET', k.entries, who))
    local passed = mine and mine.st == 'W' and tonumber(mine.seq) <= tonumber(w[1])
    if not passed and not (q and q <= tonumber(w[3] or '0')) then
      after, minq = w[1], q
    end
  end
  return (walk(k, base, sku, nonce, now, after, minq, w[1] ~= nil))
end

-- join_handoff serves a new entry (seq) at once when units are available
-- that no waiter ahead can take and they fit: a finished walk passed every
-- waiter ahead by with these units, so only the new entry is examined. While
-- a walk is unfinished the join goes on with it instead (the new entry is
-- at the back, where the walk will reach it).
local function join_handoff(k, base, sku, nonce, now, seq)
  local w = redis.call('HMGET', k.sku, 'walk', 'walkq')
  if w[1] then
    return (walk(k, base, sku, nonce, now, w[1], tonumber(w[2] or ''), true))
  end
  return (walk(k, base, sku, nonce, now, string.format('%d', tonumber(seq) - 1), nil, false))
end
