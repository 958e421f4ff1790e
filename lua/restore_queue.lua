-- restore_queue.lua: load an admission queue into Redis from the ledger: its settings and,
-- after a loss, its tickets, numbers, passes and progress. Unless Redis has the queue.
--
-- KEYS[1] {p}q:<queue>      the queue's hash: opens rate pass_ms state pre next numbered through
--                           credit last status seq
-- KEYS[2] {p}qpre:<queue>   KEYS[3] {p}qwho:<queue>   KEYS[4] {p}qnum:<queue>
-- KEYS[5] {p}qpass:<queue>  KEYS[6] {p}qlive:<queue>
-- ARGV[1] 'chunk' or 'publish'
-- chunk:   ARGV[2] '1' for the first chunk (it clears what a lost queue left behind), then per
--          ticket six values: principal, number (0 in the pre-queue), '1' when it joined the
--          pre-queue (restored into it while the queue is not open), pass ('' before its
--          admission), pass expiry (ms), pass state (A unspent, U spent)
--          ARGV[3] state the queue is published in (pre, numbering, open)
-- publish: ARGV[2] opens at (ms)   ARGV[3] admissions per minute   ARGV[4] pass life (ms)
--          ARGV[5] state (pre, numbering, open)   ARGV[6] pre-queue size
--          ARGV[7] last number given   ARGV[8] numbered   ARGV[9] admitted through
--
-- Returns {'OK'} when it wrote, {'EXISTS'} when Redis has the queue (a
-- chunk then writes nothing: the queue is live, and what it holds is newer
-- than the ledger).
--
-- A rebuild (inventory/queue Restore) writes the tickets in chunks under the
-- queue's ledger row lock, so no script blocks Redis for long however many
-- tickets there are, then publishes the queue's hash, which makes it live:
-- until then every join and step finds no queue and waits for the rebuild.
-- Only passes neither spent nor expired count against the stock (qlive).
--
-- Why one script per chunk: the check that the queue is not live and the
-- writes must be one step, or a chunk could overwrite a live queue's newer
-- tickets.
if redis.call('EXISTS', KEYS[1]) == 1 then
  return { 'EXISTS' }
end
local now = now_ms()
if ARGV[1] == 'chunk' then
  if ARGV[2] == '1' then
    redis.call('DEL', KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6])
  end
  local open = ARGV[3] == 'open'
  for i = 4, #ARGV, 6 do
    local who, num, pre, pass, exp, st = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4], ARGV[i + 5]
    redis.call('HSET', KEYS[3], who, num)
    if num ~= '0' then
      redis.call('HSET', KEYS[4], num, who)
    end
    if pre == '1' and not open then
      redis.call('SADD', KEYS[2], who)
    end
    if pass ~= '' then
      redis.call('HSET', KEYS[5], who, pass .. '|' .. exp .. '|' .. st .. '|' .. num)
      if st == 'A' and tonumber(exp) > now then
        redis.call('ZADD', KEYS[6], exp, who)
      end
    end
  end
  return { 'OK' }
end
local state = ARGV[5]
local status = 'PRE_QUEUE'
if state == 'open' then
  status = 'OPEN' -- the next step says PAUSED, SOLD_OUT or CLOSED when it is
end
-- seq starts at the clock, above every seq the lost queue handed out.
redis.call('HSET', KEYS[1], 'opens', ARGV[2], 'rate', ARGV[3], 'pass_ms', ARGV[4], 'state', state, 'pre', ARGV[6],
  'next', ARGV[7], 'numbered', ARGV[8], 'through', ARGV[9], 'credit', 0, 'last', now, 'status', status,
  'seq', now)
return { 'OK' }
