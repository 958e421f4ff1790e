-- number_queue.lua: write one batch of a closed pre-queue's numbers, in the shuffle's order.
--
-- KEYS[1] {p}q:<queue>      KEYS[2] {p}qwho:<queue>   KEYS[3] {p}qnum:<queue>
-- KEYS[4] {p}outbox         the partition's event stream: a batch that numbers is recorded (qnum)
-- ARGV[1] the queue's id
-- ARGV[2] the first number of the batch; ARGV[3..] the principals that get it and the
--         numbers after it, in order (at most 1,000: a batch is a bounded step)
--
-- Returns {'OK', numbered, pre}: how many of the pre-queue are numbered now,
-- of how many; the queue opens (state open) with the batch that numbers the
-- last. {'NOT_NUMBERING', state} when the queue is not numbering its
-- pre-queue (not closed yet, or numbered already: a batch applied twice
-- changes nothing), {'INVALID_INPUT', field, reason} for a number past the
-- pre-queue.
--
-- The order is the caller's: the draw's shuffle of the pre-queue's members
-- sorted, from the queue's seed (inventory/queue Order), which anyone can
-- recompute once the seed is revealed. Each number is written once, so a
-- batch retried after a crash is skipped number by number.
--
-- Why one script: a batch's numbers, the count and the opening must agree,
-- or the admission could start with numbers still missing.
local h = redis.call('HMGET', KEYS[1], 'state', 'pre', 'numbered')
if h[1] ~= 'numbering' then
  return { 'NOT_NUMBERING', h[1] or '' }
end
local pre, numbered = tonumber(h[2]), tonumber(h[3])
local scope, first = ARGV[1], tonumber(ARGV[2])
if not first or first < 1 or first + #ARGV - 3 > pre then
  return { 'INVALID_INPUT', 'number', 'past the pre-queue' }
end
local wrote = false
for i = 3, #ARGV do
  local num = tostring(first + i - 3)
  if redis.call('HSETNX', KEYS[3], num, ARGV[i]) == 1 then
    redis.call('HSET', KEYS[2], ARGV[i], num)
    numbered = numbered + 1
    wrote = true
  end
end
if wrote then
  -- The batch, whole: a batch retried after a crash records the same numbers.
  emit_queue(KEYS[4], 'qnum', 'qnum:' .. scope .. ':' .. ARGV[2], scope, now_ms(),
    { 'first', ARGV[2], 'list', cjson.encode({ unpack(ARGV, 3) }) })
end
redis.call('HSET', KEYS[1], 'numbered', numbered)
if numbered >= pre then
  redis.call('HSET', KEYS[1], 'state', 'open', 'seq', redis.call('HINCRBY', KEYS[1], 'seq', 1))
end
return { 'OK', numbered, pre }
