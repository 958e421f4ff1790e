-- load_queue.lua: write an admission queue's settings into Redis, unless it is there.
--
-- KEYS[1] {p}q:<queue>      the queue's hash: opens rate pass_ms state pre next numbered through
--                           credit last status seq
-- ARGV[1] opens at (ms)   ARGV[2] admissions per minute   ARGV[3] pass life (ms)
--
-- Returns {'OK'} when it wrote the queue, {'EXISTS'} when Redis had it.
--
-- Why one script: two instances may load a queue at once; the check and the
-- write must be one step, or the second would reset the first's counters.
if redis.call('EXISTS', KEYS[1]) == 1 then
  return { 'EXISTS' }
end
redis.call('HSET', KEYS[1], 'opens', ARGV[1], 'rate', ARGV[2], 'pass_ms', ARGV[3], 'state', 'pre', 'pre', 0, 'next', 0,
  'numbered', 0, 'through', 0, 'credit', 0, 'last', now_ms(), 'status', 'PRE_QUEUE', 'seq', 1)
return { 'OK' }
