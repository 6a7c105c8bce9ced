-- purge: remove a job and everything it owns, on request (an operator, a data deletion
-- request). A job a worker or janitor holds is refused: cancel it first.
-- KEYS[1] job hash   KEYS[2] text   KEYS[3] lease   KEYS[4] events stream
-- KEYS[5] ledger list   KEYS[6] leases zset   KEYS[7] queued zset   KEYS[8] spilled zset
-- KEYS[9] outbox hash   KEYS[10] outbox zset   KEYS[11] running zset   KEYS[12] stalled zset
-- KEYS[13] ended zset   KEYS[14] every job by creation time   KEYS[15] idempotency key
-- (optional)
-- ARGV[1] job id
-- Answers: {'ok', keys removed} | {'not_found'} | {'wrong_state', state}
local job, text, lease, events, ledger = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local leases, queued, spilled = KEYS[6], KEYS[7], KEYS[8]
local outbox, pending, running, stalled, ended_index = KEYS[9], KEYS[10], KEYS[11], KEYS[12], KEYS[13]
local all_jobs, idem = KEYS[14], KEYS[15]
local id = ARGV[1]

local state = redis.call('HGET', job, 'state')
if not state and redis.call('EXISTS', job) == 0 then
  return { 'not_found' }
end
if state == 'running' or state == 'stalled' then
  return { 'wrong_state', state }
end
if idem then
  local bound = redis.call('GET', idem)
  if bound and string.sub(bound, 1, #id + 1) == id .. ':' then
    redis.call('DEL', idem)
  end
end
for _, index in ipairs({ leases, queued, spilled, pending, running, stalled, ended_index, all_jobs }) do
  redis.call('ZREM', index, id)
end
return { 'ok', fmt(redis.call('DEL', job, text, lease, events, ledger, outbox)) }
