-- outbox_done: an outbox entry was carried out (idempotently): remove it, if it is still
-- the one that was read (a newer commit may have replaced it meanwhile).
-- KEYS[1] outbox hash   KEYS[2] outbox zset
-- ARGV[1] job id   ARGV[2] field   ARGV[3] the value that was carried out
-- Answers: {'ok', entries left}
local outbox, pending = KEYS[1], KEYS[2]
local id = ARGV[1]

if redis.call('HGET', outbox, ARGV[2]) == ARGV[3] then
  redis.call('HDEL', outbox, ARGV[2])
end
local left = redis.call('HLEN', outbox)
if left == 0 then
  redis.call('ZREM', pending, id)
end
return { 'ok', fmt(left) }
