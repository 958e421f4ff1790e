-- join_queue.lua: give each of a batch of principals its ticket of an admission queue, or its ticket again.
--
-- KEYS[1] {p}q:<queue>      the queue's hash (load_queue.lua)
-- KEYS[2] {p}qpre:<queue>   the pre-queue: principals who joined before the opening, unnumbered
-- KEYS[3] {p}qwho:<queue>   principal -> ticket number (0 while in the pre-queue)
-- KEYS[4] {p}qnum:<queue>   ticket number -> principal
-- KEYS[5] {p}qpass:<queue>  principal -> "pass|expires_ms|state|number" (admit_queue.lua)
-- KEYS[6] {p}outbox         the partition's event stream: a new ticket is recorded (qjoin)
-- ARGV[1] most tickets the queue may have   ARGV[2] the queue's id
-- ARGV[3..] the principals joining, each in turn (at most a few hundred: a batch is a
--           bounded step); one principal may appear twice
--
-- Returns {'OK', through, state, status, ticket...}: through the last number admitted, state
-- pre, numbering or open, status the queue's (PRE_QUEUE OPEN PAUSED SOLD_OUT CLOSED), then one
-- ticket per principal of ARGV[3..], in order: {'OK', number, replayed, pass, pass_expires_ms,
-- pass_state} (number 0 while in the pre-queue; the pass fields only for a ticket the
-- principal had, '' until admitted), {'QUEUE_FULL', most} or {'INVALID_INPUT', 'principal',
-- 'required'}. {'NEEDS_LOAD'} when the queue is not in Redis: load it and call again.
--
-- Before the opening a joiner enters the pre-queue, which the opening
-- shuffles (queue_close in lib.lua, then number_queue.lua); after it, the
-- next number. A ticket is a number, and a position a subtraction: waiting
-- costs Redis two hash fields per principal.
--
-- The caller batches the joins of one queue that arrive together (group
-- commit, as reserve.lua's): the batch decides each principal as the same
-- joins run one after the other would, at one instant.
--
-- Why one script: the one-ticket check and the numbering must be one step,
-- or one principal could get two tickets, or two principals one number; and
-- the pre-queue's closing must be the same step as the joins that see it,
-- or a join could enter a pre-queue already shuffled.
if redis.call('EXISTS', KEYS[1]) == 0 then
  return { 'NEEDS_LOAD' }
end
local now = now_ms()
local most = tonumber(ARGV[1])
local scope = ARGV[2]
local state = queue_close(KEYS[1], KEYS[2], now, scope, KEYS[6])
local h = redis.call('HMGET', KEYS[1], 'through', 'status')
local out = { 'OK', tonumber(h[1] or '0'), state, h[2] or '' }
local count = redis.call('HLEN', KEYS[3])
for i = 3, #ARGV do
  local who = ARGV[i]
  local mine = who ~= '' and redis.call('HGET', KEYS[3], who)
  if who == '' then
    out[#out + 1] = { 'INVALID_INPUT', 'principal', 'required' }
  elseif mine then
    local pass, exp, st = string.match(redis.call('HGET', KEYS[5], who) or '', '^([^|]+)|(%d+)|(%a)|')
    out[#out + 1] = { 'OK', tonumber(mine), 1, pass or '', tonumber(exp or '0'), st or '' }
  elseif count >= most then
    out[#out + 1] = { 'QUEUE_FULL', ARGV[1] }
  else
    if state == 'pre' then
      redis.call('SADD', KEYS[2], who)
      mine = '0'
    else
      mine = tostring(redis.call('HINCRBY', KEYS[1], 'next', 1))
      redis.call('HSET', KEYS[4], mine, who)
    end
    redis.call('HSET', KEYS[3], who, mine)
    count = count + 1
    emit_queue(KEYS[6], 'qjoin', 'qjoin:' .. scope .. ':' .. who, scope, now, { 'who', who, 'num', mine })
    out[#out + 1] = { 'OK', tonumber(mine), 0, '', 0, '' }
  end
end
return out
