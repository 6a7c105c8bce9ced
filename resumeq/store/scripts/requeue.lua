-- requeue: an operator sends a spilled job back to a queue (spilled -> queued), maybe to
-- another queue, with another provider profile (a reserved or paid lane), a larger
-- budget or another floor. Its spill
-- count stays: a job that fails again after a spill goes to failed, never back to spill.
-- The next attempt goes into the outbox in the same step.
-- KEYS[1] job hash   KEYS[2] queued zset   KEYS[3] spilled zset   KEYS[4] events stream
-- KEYS[5] outbox hash   KEYS[6] outbox zset
-- ARGV[1] queue ('' to keep)   ARGV[2] spec JSON ('' to keep)   ARGV[3] its prompt hash
-- ARGV[4] revision the operator looked at ('' for any)   ARGV[5] request id
-- ARGV[6] a new budget ('' to keep; the spec in ARGV[2] carries it too)
-- ARGV[7] a new floor ('' to keep; the spec in ARGV[2] carries it too)
-- Answers: {'ok', revision} | {'not_found'} | {'wrong_state', state}
--   | {'stale_revision', current} | {'corrupt', field}
local job, queued, spilled, events = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local outbox, pending = KEYS[5], KEYS[6]

if replayed(job, ARGV[5]) then
  return { 'ok', redis.call('HGET', job, 'revision') }
end
local refused = expect_state(job, { spilled = true })
if refused then
  return refused
end
refused = check_revision(job, ARGV[4])
if refused then
  return refused
end
local now = now_ms()
local id = redis.call('HGET', job, 'id')
if ARGV[1] ~= '' then
  redis.call('HSET', job, 'queue', ARGV[1])
end
if ARGV[2] ~= '' then
  redis.call('HSET', job, 'spec', ARGV[2], 'prompt_hash', ARGV[3])
end
if ARGV[6] ~= '' then
  redis.call('HSET', job, 'budget_tokens', ARGV[6])
end
if ARGV[7] ~= '' then
  redis.call('HSET', job, 'floor_tokens', ARGV[7])
end
redis.call('HSET', job, 'state', 'queued', 'reason', 'requeued from spill', 'failures', '0')
-- a person chose to try again: the run of failures that spilled it starts over
redis.call('HDEL', job, 'failing_since_ms')
stamp(job, ARGV[5])
local rev = bump(job, now)
redis.call('ZREM', spilled, id)
redis.call('ZADD', queued, fmt(now), id)
local next_attempt = fmt(tonumber(redis.call('HGET', job, 'attempt')) + 1)
next_attempt_due(job, outbox, pending, id, redis.call('HGET', job, 'queue'), next_attempt, now, now)
event(events, rev, 'state', 'queued', 'reason', 'requeued from spill')
return { 'ok', fmt(rev) }
