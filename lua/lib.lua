-- lib.lua: helpers shared by every Dropline script. The Go loader prepends this
-- file to each script, so the scripts stay single atomic units on the server.
--
-- Keys. A script receives in KEYS every key its caller can name, in the
-- order its header gives (inventory/keys.go builds them), and the helpers
-- below take those keys as parameters. A script derives a key itself only
-- from data it has just read: the hold an idempotency record points at, the
-- SKU of a hold its caller knows by token only, the holds of a rebuild chunk.
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

-- sku_keys returns the keys of one SKU: its stock hash, its quota hash and
-- its announce channel.
local function sku_keys(base, sku)
  return { sku = base .. 'sku:' .. sku, quota = base .. 'quota:' .. sku, channel = base .. 'avail:' .. sku }
end

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- is_int reports whether s is a decimal integer within [lo, hi].
local function is_int(s, lo, hi)
  if type(s) ~= 'string' or not string.match(s, '^%-?%d+$') or #s > 15 then
    return false
  end
  local n = tonumber(s)
  return n >= lo and n <= hi
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

-- announce publishes a SKU's stock to its sharded channel. Subscribers treat
-- the message as a hint with a sequence number; correctness never depends on it.
-- The JSON is built by hand: cjson prints numbers with 14 significant digits,
-- and seq (it starts at the rebuild's time in microseconds) has 16.
-- sku_key is the SKU's stock hash, channel its announce channel.
local function announce(sku_key, channel, sku)
  local s = redis.call('HMGET', sku_key, 'total', 'avail', 'held', 'sold', 'seq', 'upd')
  redis.call('SPUBLISH', channel, string.format(
    '{"sku":%s,"total":%s,"available":%s,"held":%s,"sold":%s,"seq":%s,"at":%s}',
    cjson.encode(sku), s[1], s[2], s[3], s[4], s[5], s[6]))
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
local function emit(outbox, kind, token, h, now, id)
  redis.call('XADD', outbox, '*',
    'id', id or (kind .. ':' .. token), 'type', kind, 'tok', token, 'sku', h['sku'], 'who', h['who'],
    'qty', h['qty'], 'exp', h['exp'], 'ctd', h['ctd'], 'at', tostring(now),
    'idem', h['idem'] or '', 'fp', h['fp'] or '', 'gen', h['gen'] or '', 'ext', h['ext'] or '0')
end

-- release returns a HELD hold's units to the SKU. Callers have checked that the
-- hold is HELD; status is CANCELLED or EXPIRED. k names the keys it touches:
-- hold, sku, quota, channel, expiry, committing, outbox.
local function release(k, token, h, status, now, retention)
  local qty = tonumber(h['qty'])
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
  emit(k.outbox, status == 'CANCELLED' and 'cancel' or 'expire', token, h, now)
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

