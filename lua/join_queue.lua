-- join_queue.lua: give a principal its ticket of an admission queue, or its ticket again.
--
-- KEYS[1] {p}q:<queue>      the queue's hash (load_queue.lua)
-- KEYS[2] {p}qpre:<queue>   the pre-queue: principals who joined before the opening, unnumbered
-- KEYS[3] {p}qwho:<queue>   principal -> ticket number (0 while in the pre-queue)
-- KEYS[4] {p}qnum:<queue>   ticket number -> principal
-- KEYS[5] {p}qpass:<queue>  principal -> "pass|expires_ms|state|number" (admit_queue.lua)
-- KEYS[6] {p}outbox         the partition's event stream: a new ticket is recorded (qjoin)
-- ARGV[1] principal   ARGV[2] most tickets the queue may have   ARGV[3] the queue's id
--
-- Returns the ticket {'OK', number, through, state, status, pass, pass_expires_ms, pass_state,
-- replayed}: number 0 while in the pre-queue, through the last number admitted, state pre,
-- numbering or open, status the queue's (PRE_QUEUE OPEN PAUSED SOLD_OUT CLOSED), the pass
-- fields '' until admitted; or {'NEEDS_LOAD'} (the queue is not in Redis: load it and call
-- again), {'QUEUE_FULL', most}.
--
-- Before the opening a joiner enters the pre-queue, which the opening
-- shuffles (queue_close in lib.lua, then number_queue.lua); after it, the
-- next number. A ticket is a number, and a position a subtraction: waiting
-- costs Redis two hash fields per principal.
--
-- Why one script: the one-ticket check and the numbering must be one step,
-- or one principal could get two tickets, or two principals one number; and
-- the pre-queue's closing must be the same step as the join that sees it,
-- or a join could enter a pre-queue already shuffled.
local who = ARGV[1]
if who == '' then
  return { 'INVALID_INPUT', 'principal', 'required' }
end
if redis.call('EXISTS', KEYS[1]) == 0 then
  return { 'NEEDS_LOAD' }
end
local now = now_ms()
local scope = ARGV[3]
local state = queue_close(KEYS[1], KEYS[2], now, scope, KEYS[6])
local replayed = 1
local mine = redis.call('HGET', KEYS[3], who)
if not mine then
  if redis.call('HLEN', KEYS[3]) >= tonumber(ARGV[2]) then
    return { 'QUEUE_FULL', ARGV[2] }
  end
  replayed = 0
  if state == 'pre' then
    redis.call('SADD', KEYS[2], who)
    mine = '0'
  else
    mine = tostring(redis.call('HINCRBY', KEYS[1], 'next', 1))
    redis.call('HSET', KEYS[4], mine, who)
  end
  redis.call('HSET', KEYS[3], who, mine)
  emit_queue(KEYS[6], 'qjoin', 'qjoin:' .. scope .. ':' .. who, scope, now, { 'who', who, 'num', mine })
end
local h = redis.call('HMGET', KEYS[1], 'through', 'status')
local pass, exp, st = string.match(redis.call('HGET', KEYS[5], who) or '', '^([^|]+)|(%d+)|(%a)|')
return { 'OK', tonumber(mine), tonumber(h[1]), state, h[2], pass or '', tonumber(exp or '0'), st or '', replayed }
