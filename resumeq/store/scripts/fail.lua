-- fail: a janitor ends a job whose record cannot be read back (edited by hand, half
-- deleted) as failed, with the reason, without trusting any of its fields.
-- KEYS[1] job hash   KEYS[2] lease   KEYS[3] leases zset   KEYS[4] queued zset
-- KEYS[5] spilled zset   KEYS[6] events stream   KEYS[7] text   KEYS[8] ledger list
-- KEYS[9] outbox hash   KEYS[10] outbox zset   KEYS[11] running zset   KEYS[12] stalled zset
-- KEYS[13] ended zset   KEYS[14] totals   KEYS[15] idempotency key (optional)
-- ARGV[1] job id   ARGV[2] reason   ARGV[3] retention (s)
-- Answers: {'ok', revision} | {'not_found'} | {'wrong_state', state}
local job, lease, leases, queued, spilled = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local events, text, ledger, outbox, pending = KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[10]
local running, stalled, ended_index, totals, idem = KEYS[11], KEYS[12], KEYS[13], KEYS[14], KEYS[15]
local id = ARGV[1]

for _, index in ipairs({ leases, queued, spilled, running, stalled }) do
  redis.call('ZREM', index, id)
end
outbox_clear(outbox, pending, id)
if redis.call('EXISTS', job) == 0 then
  redis.call('DEL', lease)
  return { 'not_found' }
end
local state = redis.call('HGET', job, 'state')
if state and TERMINAL[state] then
  return { 'wrong_state', state }
end
local now = now_ms()
local rev = (tonumber(redis.call('HGET', job, 'revision')) or 0) + 1
redis.call('HSET', job, 'state', 'failed', 'error', ARGV[2], 'revision', fmt(rev),
  'updated_ms', fmt(now), 'finished_ms', fmt(now))
redis.call('DEL', lease)
ended(totals, ended_index, id, 'failed', now, job)
event(events, rev, 'state', 'failed', 'error', ARGV[2])
retire(ARGV[3], job, text, events, ledger)
retire_idempotency(idem, id, ARGV[3])
return { 'ok', fmt(rev) }
