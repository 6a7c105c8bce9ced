-- durable: a replica acknowledged every write up to the job's revision ARGV[1] (the writer
-- ran WAIT after it): followers may show the events held until then. Writes a 'durable'
-- marker to the events stream (no delta, no state) and keeps the highest such revision in
-- the record. A job whose events are gone, or a revision already marked, writes nothing.
-- KEYS[1] job hash   KEYS[2] events stream
-- ARGV[1] the revision a replica holds
-- Answers: {'ok', '1' marked | '0' nothing to mark}
local job, events = KEYS[1], KEYS[2]
local rev = tonumber(ARGV[1])
if not rev or redis.call('EXISTS', events) == 0 then
  return { 'ok', '0' }
end
local marked = tonumber(redis.call('HGET', job, 'durable_revision') or '0') or 0
local current = tonumber(redis.call('HGET', job, 'revision') or '0') or 0
if rev <= marked or rev > current then
  -- Already marked, or a revision this node does not have (a replica other than the one
  -- promoted acknowledged it): nothing to vouch for here.
  return { 'ok', '0' }
end
redis.call('HSET', job, 'durable_revision', fmt(rev))
redis.call('XADD', events, '*', 'rev', fmt(rev), 'durable', '1')
return { 'ok', '1' }
