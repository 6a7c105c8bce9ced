-- cancel: end a job that is not terminal yet. The owner's next renew or flush is refused
-- with 'cancelled', so it closes its stream. Nothing follows a cancel: the outbox is
-- cleared.
-- KEYS[1] job hash   KEYS[2] lease   KEYS[3] leases zset   KEYS[4] queued zset
-- KEYS[5] spilled zset   KEYS[6] events stream   KEYS[7] text   KEYS[8] ledger list
-- KEYS[9] outbox hash   KEYS[10] outbox zset   KEYS[11] running zset   KEYS[12] stalled zset
-- KEYS[13] ended zset   KEYS[14] totals   KEYS[15] responses to stop zset
-- KEYS[16] idempotency key (optional)
-- ARGV[1] reason   ARGV[2] retention (s)   ARGV[3] request id
-- Answers: {'ok', revision} | {'not_found'} | {'wrong_state', state} | {'corrupt', field}
local job, lease, leases, queued, spilled = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local events, text, ledger, outbox, pending = KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[10]
local running, stalled, ended_index, totals = KEYS[11], KEYS[12], KEYS[13], KEYS[14]
local stops, idem = KEYS[15], KEYS[16]

if replayed(job, ARGV[3]) then
  return { 'ok', redis.call('HGET', job, 'revision') }
end
local refused = expect_state(job, nil)
if refused then
  return refused
end
local now = now_ms()
local id = redis.call('HGET', job, 'id')
redis.call('HSET', job, 'state', 'cancelled', 'reason', ARGV[1], 'finished_ms', fmt(now))
stamp(job, ARGV[3])
local rev = bump(job, now)
redis.call('DEL', lease)
redis.call('ZREM', leases, id)
redis.call('ZREM', queued, id)
redis.call('ZREM', spilled, id)
redis.call('ZREM', running, id)
redis.call('ZREM', stalled, id)
ended(totals, ended_index, id, 'cancelled', now, job)
outbox_clear(outbox, pending, id)
-- A background response of the job's may still be generating, for nobody: the janitor
-- cancels it at the provider (a producer's process knows no provider keys).
local response = redis.call('HGET', job, 'response_id')
if response then
  local provider = string.match(redis.call('HGET', job, 'response_for') or '', '^(%S+)') or ''
  redis.call('ZADD', stops, 'NX', now, id .. ' ' .. response .. ' ' .. provider)
end
event(events, rev, 'state', 'cancelled', 'reason', ARGV[1])
retire(ARGV[2], job, text, events, ledger)
retire_idempotency(idem, id, ARGV[2])
return { 'ok', fmt(rev) }
