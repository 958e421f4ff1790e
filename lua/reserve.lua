-- reserve.lua: take units of one SKU for each of a batch of principals, or say
-- why not, each buyer in turn (group commit: the engine coalesces concurrent
-- reserves of one partition into one run of this script).
--
-- What the requests of a batch share is named once, not per request: each
-- argument costs Redis about as much to read as a small command does, and
-- a batch's requests are mostly of one SKU and one budget.
--
-- KEYS[1]  {p}expiry             HELD tokens by expiry (ms)
-- KEYS[2]  {p}outbox             the partition's event stream
-- then three keys per SKU j = 0..s-1 of the batch (ARGV[6]), at KEYS[3+3j] .. KEYS[5+3j]:
--          {p}sku:<sku>          stock hash (total avail held sold max start end ver seq upd gen)
--          {p}quota:<sku>        units each principal holds or bought of this SKU (field: principal)
--          {p}avail:<sku>        the SKU's announce channel
-- then one key per request i = 0..n-1, at KEYS[3+3s+i]:
--          rate:...:<principal>  the principal's mutation budget (see rate_limit.lua), when
--                                this run spends it; a placeholder key of the partition,
--                                never touched, when it does not. Only a single Redis is
--                                given a budget here: on a cluster it lives in another slot.
-- ARGV[1]  partition base, for the keys derived here (e.g. "dl:{p07}:"): each request's
--          hold (hold_key of its token) and idempotency record (idem_key of its hash), which
--          its token and hash name; the hold an idempotency record names (read from the
--          record, so the caller cannot know it); and for a SKU of a drop (its stock hash
--          names the drop), the drop's hash and the stock and quota hashes of each of the
--          drop's SKUs (at most 100, listed in the drop's hash)
-- ARGV[2]  idempotency TTL seconds    ARGV[3] max quantity per call
-- ARGV[4]  max hold milliseconds      ARGV[5] rejection TTL seconds (how long a rejection replays)
-- ARGV[6]  s, how many SKUs the batch names   ARGV[7] b, how many budgets it names
-- then the s SKUs, at ARGV[8+j], in the order of their keys
-- then three arguments per budget k = 1..b, at ARGV[5+s+3k] .. ARGV[7+s+3k]: its burst,
--          rate and period in seconds
-- then nine arguments per request i, at ARGV[8+s+3b+9i] .. ARGV[16+s+3b+9i]:
--          sku (one of the s), principal, quantity, hold milliseconds, token,
--          request fingerprint ("" when the call has no idempotency key), idempotency hash ("" when none),
--          its budget's number k ("" when this run does not spend one),
--          the admission pass presented ("" when none; only a queued SKU asks for one)
-- then, optionally (only when a request of the batch is traced), one more argument per
-- request i, at ARGV[8+s+3b+9n+i]: its W3C traceparent, or "" when it is not traced. A hold's
-- event carries it (field tp), so the write-behind that records the hold continues its trace.
--
-- The new hold carries the SKU's generation (see sku_gen in lib.lua).
--
-- Whether a request may take its units is may_take's decision (lib.lua), the
-- one policy every path that hands out units shares: the product's sale mode
-- must admit a reserve (one sold by draw answers DRAW_ONLY), a queued one
-- asks for its buyer's admission pass (pass_check), then the sale
-- window, the per-person limit, the drop's window and limit (the units the
-- principal holds or bought of every SKU of the drop, summed from their quota
-- hashes, so the drop's count needs no state of its own and is right whatever
-- released, sold or rebuilt any of them) and the stock.
--
-- Returns the run's clock (created_ms of every hold it made), then one reply per
-- request, in order: expires_ms, a number, for a hold this run made (its token,
-- SKU, principal and quantity are the request's, so they are not sent back; a
-- number costs Redis far less to send than a table, which it searches for
-- error, status and map fields), hold_reply('OK', ...) for a replay, or a
-- rejection {code, a, b, replayed}: RATE_LIMITED {retry_after seconds}
-- (the budget is spent: nothing else was looked at), INVALID_INPUT {field, reason},
-- IDEMPOTENCY_KEY_REUSED, NEEDS_HYDRATION {sku} (that SKU, or another of its drop, or the drop
-- itself, is not in Redis: rebuild the SKU named from Postgres, which brings its drop too, and
-- retry), WALK_PENDING {sku} (the units are there, but the SKU's waitlist walk is unfinished
-- and they may still be a waiter's: finish the walk with continue_walk.lua and retry),
-- SALE_NOT_ACTIVE {starts_ms, ends_ms}, QUOTA_EXCEEDED {limit, already},
-- OUT_OF_STOCK {available}, DRAW_ONLY (the product is sold by draw), QUEUE_REQUIRED,
-- PASS_EXPIRED, PASS_INVALID (a queued product: no pass, or not a valid one), or ERR {message} when
-- deciding that request raised an error (the others are answered all the same).
--
-- Why one script: the checks and the deduction must be one step. Anything in
-- between (a GET, then a DECRBY) is a window in which two buyers both see the
-- last unit. Each request runs every check before its first write, because
-- Redis does not roll a script back, and sees the writes of the requests
-- before it: the batch decides exactly what the same requests run one after
-- the other would. A request's own writes (quota, hold, event) are
-- complete before the next request starts, so an error in a later request
-- leaves every earlier one whole, and fails that request alone (ERR): the
-- callers of the others get their answers. What the requests share is
-- written once, after the last request (nothing else runs meanwhile, and
-- nothing the requests do reads it in Redis): the expiry set, one ZADD of
-- every hold the run made; and each SKU's stock hash and announcement: the
-- hash is read once per run, by the first request of its SKU that gets that
-- far, each request checks and deducts on the run's copy of the counters,
-- and each SKU the batch changed is written and announced once. A retried
-- batch (same tokens) replays the holds it made.
--
-- A request that carries its principal's budget spends it here, first, as
-- rate_limit.lua would have just before (a refused one is answered
-- RATE_LIMITED and nothing else happens), so a reserve is one script run
-- and not two. Every decided request spends one unit, as a mutation does;
-- one that finds its hold made already (a retried batch) or must wait for a
-- rebuild or a waitlist walk (NEEDS_HYDRATION, WALK_PENDING: the engine
-- calls again, and that call spends) does not.

local base = ARGV[1]
local expiry, outbox = KEYS[1], KEYS[2]
local idem_ttl, max_qty, max_hold, rejection_ttl = ARGV[2], ARGV[3], tonumber(ARGV[4]), ARGV[5]
local max_qty_n = tonumber(max_qty)
local clock = redis.call('TIME')
local now = now_ms(clock)
local now_s = tostring(now)
local rate_clock = rate_now(clock)

-- skus gives each SKU the batch names the index in KEYS of its three keys.
local nskus = count(ARGV[6])
local skus = {}
for j = 0, nskus - 1 do
  skus[ARGV[8 + j]] = 3 + 3 * j
end

-- stock is each SKU's stock hash as this run has left it, by key: read once
-- by stock_of and written once by flush_stock (the header says why that is
-- safe). moved says the run changed the counters.
local stock = {}
local exact_seq = 9007199254740992

-- retried says whether any hold this batch's requests would make exists
-- already: one EXISTS over the batch's hold keys, so that only a retried
-- batch (the reply of an earlier run of the same requests was lost) reads
-- each request's hold. made holds the tokens of the holds this run made, so
-- that a later request of the same token finds its hold as before.
local retried, made = false, {}

-- expiries is the expiry set's scores and members of the holds this run
-- made (exp, token, exp, token ...), added by one ZADD after the last
-- request: nothing a request does reads the set, and a request's error
-- (pcall) stops no later write of the run, so every hold made gets its
-- entry as it did when each request added its own. The first hold's are
-- kept in first_exp and first_token, and the table made only for a second
-- (a batch of one makes none).
local first_exp, first_token, expiries = nil, nil, nil

-- exp_text is the expiry, as text, of the last hold this run made, which
-- lasted exp_text_ms: the run's requests share one clock and mostly ask one
-- duration, so the expiry is mostly printed once a run.
local exp_text, exp_text_ms = nil, nil

-- exact reports whether a copy's sequence is one a Lua number holds
-- exactly: below 2^53 (it starts at a rebuild's time in microseconds).
-- Beyond, or when missing, bump_stock moves the hash itself and the SKU is
-- read again by its next request.
local function exact(st)
  return st.seq and st.seq < exact_seq
end

local function stock_of(sku_key)
  local st = stock[sku_key]
  if st then
    return st
  end
  local s = redis.call('HMGET', sku_key, 'gen', 'avail', 'held', 'seq', 'max', 'start', 'end', 'drop', 'mode',
    'total', 'sold', 'walk')
  if not s[1] then
    return nil
  end
  st = {
    gen = s[1], avail = tonumber(s[2]), held = tonumber(s[3] or '0'), seq = tonumber(s[4] or ''),
    max = tonumber(s[5] or '0'), starts = tonumber(s[6] or '0'), ends = tonumber(s[7] or '0'),
    drop = (s[8] and s[8] ~= '') and s[8] or nil, mode = (s[9] and s[9] ~= '') and s[9] or nil,
    total = s[10], sold = s[11], walk = s[12], moved = false, view = false,
  }
  stock[sku_key] = st
  return st
end

-- flush_stock writes what the run changed of a SKU's counters, in one HSET.
local function flush_stock(sku_key, st)
  if st.moved then
    redis.call('HSET', sku_key, 'avail', string.format('%d', st.avail), 'held', string.format('%d', st.held),
      'upd', now_s, 'seq', string.format('%d', st.seq))
    st.moved = false
  end
end

-- reject records a business rejection for idempotent replay (when the
-- request has an idempotency key: fp is its fingerprint, idem_rec its record),
-- then returns it. A rejection lives rejection_ttl seconds, not the
-- idempotency TTL of a hold: every fresh key a client gets refused costs Redis
-- a record, and a short life is what bounds the memory one principal can pin
-- (its mutation rate times this).
local function reject(fp, idem_rec, code, ra, rb)
  if fp ~= '' then
    redis.call('HSET', idem_rec, 'fp', fp, 'code', code, 'a', tostring(ra), 'b', tostring(rb))
    redis.call('EXPIRE', idem_rec, rejection_ttl)
  end
  return { code, tostring(ra), tostring(rb), 0 }
end

-- reserve_new decides a request that made no hold yet, after its budget
-- allowed it: its SKU's three keys start at KEYS[sk], its nine arguments at
-- ARGV[ai], hold is its hold's key, qty its quantity (qty_s the same as
-- text) and hold_ms how long the hold lasts. It returns the request's reply,
-- and its SKU's stock hash and channel when it changed the stock.
local function reserve_new(sk, ai, hold, qty, qty_s, hold_ms, tp)
  local sku_key, quota, channel = KEYS[sk], KEYS[sk + 1], KEYS[sk + 2]
  local sku, who, token, fp, idem = ARGV[ai], ARGV[ai + 1], ARGV[ai + 4], ARGV[ai + 5], ARGV[ai + 6]
  local pass = ARGV[ai + 8]
  -- The record is named only when the request has one (fp is set with idem).
  local idem_rec = fp ~= '' and idem_key(base, idem)

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

  -- 3. The product must be loaded. It is not cached as a rejection: the caller
  -- rebuilds the SKU from Postgres and calls again.
  local st = stock_of(sku_key)
  if not st then
    return { 'NEEDS_HYDRATION', sku, '', 0 }
  end

  -- 4. The policy (may_take in lib.lua): the product's sale mode must admit
  -- a reserve, then the sale window on Redis' clock (every server agrees on
  -- it), the per-person limit (units held plus bought), the drop's window
  -- and limit across every SKU of the drop, and the stock, in that order.
  -- The view is made once per SKU of the run, with the SKU's copy; each
  -- request sets its own free units and pass (nothing keeps the view).
  local view = st.view
  if not view then
    view = {
      sku = sku, mode = st.mode, max = st.max, starts = st.starts, ends = st.ends, drop = st.drop, quota = quota,
      free = st.avail, pass = pass,
    }
    st.view = view
  end
  view.free, view.pass = st.avail, pass
  local no = may_take('reserve', base, view, who, qty, now)
  if no and no[1] == 'NEEDS_HYDRATION' then
    return { 'NEEDS_HYDRATION', no[2], '', 0 }
  elseif no and (no[1] == 'QUEUE_REQUIRED' or no[1] == 'PASS_EXPIRED' or no[1] == 'PASS_INVALID') then
    -- Not recorded for replay: it answers the pass, not the request, and
    -- the same request with the pass it lacked must be decided anew.
    return { no[1], no[2], no[3], 0 }
  elseif no then
    return reject(fp, idem_rec, no[1], no[2], no[3])
  end
  -- 4b. The units are there, but the SKU's waitlist walk is unfinished
  -- (walk in lib.lua): they may still be a waiter's. Not recorded: the
  -- caller finishes the walk and asks again.
  if st.walk then
    return { 'WALK_PENDING', sku, '', 0 }
  end

  -- 5. Every check passed: write.
  -- The hold's fields idem and fp are left out when empty (every reader
  -- takes a missing one as empty): two fields fewer in the common hold.
  local exp = now + hold_ms
  local exp_s = exp_text
  if hold_ms ~= exp_text_ms then
    exp_s = string.format('%d', exp)
    exp_text, exp_text_ms = exp_s, hold_ms
  end
  if fp == '' and idem == '' then
    redis.call('HSET', hold, 'sku', sku, 'who', who, 'qty', qty_s, 'st', 'HELD', 'exp', exp_s, 'ctd', now_s, 'gen', st.gen)
  else
    redis.call('HSET', hold, 'sku', sku, 'who', who, 'qty', qty_s, 'st', 'HELD',
      'exp', exp_s, 'ctd', now_s, 'idem', idem, 'fp', fp, 'gen', st.gen)
  end
  made[token] = true
  redis.call('HINCRBY', quota, who, qty_s)
  if expiries then
    expiries[#expiries + 1] = exp_s
    expiries[#expiries + 1] = token
  elseif first_exp then
    expiries = { first_exp, first_token, exp_s, token }
  else
    first_exp, first_token = exp_s, token
  end
  spend_pass(base, view, who, now, token, outbox)
  if exact(st) then
    st.avail, st.held, st.seq, st.moved = st.avail - qty, st.held + qty, st.seq + 1, true
  else
    flush_stock(sku_key, st)
    bump_stock(sku_key, -qty, qty, 0, now)
    stock[sku_key] = nil
  end
  if fp ~= '' then
    redis.call('HSET', idem_rec, 'fp', fp, 'code', 'OK', 'tok', token)
    redis.call('EXPIRE', idem_rec, idem_ttl)
  end
  emit_event(outbox, 'reserve:' .. token, 'reserve', token, sku, who, qty_s, exp_s, now_s, now_s, idem, fp, st.gen, '0', tp)
  return exp, sku_key, channel
end

-- budget_of returns the emission interval and burst offset (rate_budget)
-- of the batch's budget numbered k (its text, as the request names it),
-- computed once per run for each budget the run meets.
local budgets, expiry_texts = {}, {}
local function budget_of(k)
  local b = budgets[k]
  if not b then
    local at = 5 + nskus + 3 * count(k)
    local interval, offset = rate_budget(tonumber(ARGV[at]), tonumber(ARGV[at + 1]), tonumber(ARGV[at + 2]))
    b = { interval, offset }
    budgets[k] = b
  end
  return b[1], b[2]
end

-- quantity_of returns a quantity's text checked (is_int) as {number, text}
-- (the text as the hold and its event record it: the argument itself when it
-- is written as tostring would write it), or false; hold_of a hold's
-- milliseconds as a number, or false. Each distinct text is checked once a
-- run: a batch's requests mostly ask the same quantity and duration, and a
-- pattern match costs more than the rest of a request's validation.
local quantities, holds_ms = {}, {}
local function quantity_of(s)
  local q = s and quantities[s]
  if q == nil then
    local n = is_int(s, 1, max_qty_n)
    q = n and { n, string.match(s, '^[1-9]%d*$') and s or tostring(n) }
    quantities[s] = q
  end
  return q
end

local function hold_of(s)
  local h = s and holds_ms[s]
  if h == nil then
    h = is_int(s, 1000, max_hold)
    holds_ms[s] = h
  end
  return h
end

-- reserve_one decides one request, whose budget's key is KEYS[bk], nine
-- arguments start at ARGV[ai] and hold's key is hold; tp is its traceparent
-- (nil or "" when untraced). It returns what reserve_new returns.
local function reserve_one(bk, ai, hold, tp)
  local sku, who, qty, token = ARGV[ai], ARGV[ai + 1], ARGV[ai + 2], ARGV[ai + 4]
  local k = ARGV[ai + 7]

  -- 1. Validate (quantity_of, hold_of: once per distinct text a run).
  local q = quantity_of(qty)
  if not q then
    return { 'INVALID_INPUT', 'quantity', 'must be between 1 and ' .. max_qty, 0 }
  end
  local qty_n, qty_s = q[1], q[2]
  local hold_ms = hold_of(ARGV[ai + 3])
  if not hold_ms then
    return { 'INVALID_INPUT', 'holdSeconds', 'out of range', 0 }
  end
  if sku == '' or who == '' or token == '' then
    return { 'INVALID_INPUT', 'input', 'sku, principal and token are required', 0 }
  end

  local sk = skus[sku]
  if not sk then
    error('SKU ' .. sku .. ' is not one of the batch')
  end

  -- A retry of this very call (the reply was lost) finds its own hold.
  local mine = (retried or made[token]) and hash_get(hold)
  if mine then
    if mine['who'] ~= who or mine['sku'] ~= sku then
      return { 'INVALID_INPUT', 'token', 'token already used', 0 }
    end
    return hold_reply('OK', token, mine, 1)
  end

  -- 1b. The principal's budget, when this run spends it.
  if k == '' then
    return reserve_new(sk, ai, hold, qty_n, qty_s, hold_ms, tp)
  end
  local budget = KEYS[bk]
  local interval, offset = budget_of(k)
  local ok, tat, reset = rate_check(budget, interval, offset, rate_clock)
  if not ok then
    return { 'RATE_LIMITED', tat, '', 0 }
  end
  local r, sku_key, channel = reserve_new(sk, ai, hold, qty_n, qty_s, hold_ms, tp)
  if type(r) == 'number' or (r[1] ~= 'NEEDS_HYDRATION' and r[1] ~= 'WALK_PENDING') then
    rate_spend(budget, tat, reset, expiry_texts)
  end
  return r, sku_key, channel
end

local replies, changed, order = { now }, {}, {}
local n = #KEYS - 2 - 3 * nskus
local args = 8 + nskus + 3 * count(ARGV[7])
local tps = args + 9 * n
-- holds are the requests' hold keys, named from their tokens.
local holds = {}
for i = 0, n - 1 do
  holds[i + 1] = hold_key(base, ARGV[args + 9 * i + 4])
end
if n > 0 then
  retried = redis.call('EXISTS', unpack(holds)) > 0
end
for i = 0, n - 1 do
  local ai = args + 9 * i
  local ok, r, sku_key, channel = pcall(reserve_one, 3 + 3 * nskus + i, ai, holds[i + 1], ARGV[tps + i])
  if not ok then
    -- An error fails this request alone; the requests before it are
    -- decided and written, and keep their replies.
    local msg = type(r) == 'table' and (r.err or r.message) or r
    r, sku_key = { 'ERR', tostring(msg), '', 0 }, nil
  end
  replies[#replies + 1] = r
  if sku_key and not changed[sku_key] then
    changed[sku_key] = true
    order[#order + 1] = { sku_key, channel, ARGV[ai] }
  end
end
if expiries then
  redis.call('ZADD', expiry, unpack(expiries))
elseif first_exp then
  redis.call('ZADD', expiry, first_exp, first_token)
end
-- Each SKU the run changed: first every counter written, then each SKU
-- announced, by publish_stock from the run's copy when its sequence is
-- exact (announce reads the hash of a SKU whose hash bump_stock moved last,
-- or whose sequence the run read again past 2^53).
for _, c in ipairs(order) do
  local st = stock[c[1]]
  if st then
    flush_stock(c[1], st)
  end
end
for _, c in ipairs(order) do
  local st = stock[c[1]]
  if st and exact(st) then
    publish_stock(c[2], c[3], st.total, string.format('%d', st.avail), string.format('%d', st.held), st.sold,
      string.format('%d', st.seq), now_s)
  else
    announce(c[1], c[2], c[3])
  end
end
return replies
