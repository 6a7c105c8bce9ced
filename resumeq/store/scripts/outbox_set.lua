-- outbox_set: replace an outbox entry, if it is still the one that was read (a janitor
-- counting how often it had to enqueue a hook again).
-- KEYS[1] outbox hash
-- ARGV[1] field   ARGV[2] the value that was read   ARGV[3] the new value
-- Answers: {'ok'} | {'changed'}
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then
  return { 'changed' }
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
return { 'ok' }
