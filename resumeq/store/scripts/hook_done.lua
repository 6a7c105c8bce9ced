-- hook_done: the hook ran. Recorded in the job, its lease dropped (if still this run's),
-- its outbox entry removed: nobody runs it again. Safe to send twice.
-- KEYS[1] job hash   KEYS[2] hook lease   KEYS[3] outbox hash   KEYS[4] outbox zset
-- ARGV[1] job id   ARGV[2] hook name   ARGV[3] token
-- Answers: {'ok'} | {'not_found'}
local job, lease, outbox, pending = KEYS[1], KEYS[2], KEYS[3], KEYS[4]

if redis.call('EXISTS', job) == 0 then
  return { 'not_found' }
end
redis.call('HSET', job, 'hook_done:' .. ARGV[2], fmt(now_ms()))
if redis.call('GET', lease) == ARGV[3] then
  redis.call('DEL', lease)
end
redis.call('HDEL', outbox, 'hook:' .. ARGV[2])
if redis.call('HLEN', outbox) == 0 then
  redis.call('ZREM', pending, ARGV[1])
end
return { 'ok' }
