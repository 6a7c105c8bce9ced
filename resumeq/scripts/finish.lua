-- finish: the owner ends the job as done or failed, appends its attempt's ledger record,
-- drops the lease and starts the retention clock.
-- KEYS[1] job hash   KEYS[2] lease   KEYS[3] leases zset   KEYS[4] events stream
-- KEYS[5] text   KEYS[6] ledger list
-- ARGV[1] fencing token   ARGV[2] expected revision ('' for any)   ARGV[3] 'done' | 'failed'
-- ARGV[4] finish reason   ARGV[5] error   ARGV[6] ledger record JSON ('' for none)
-- ARGV[7] retention (s)
-- Answers: {'ok', revision} | {'not_found'} | {'cancelled'} | {'lease_lost', state}
--   | {'wrong_state', state} | {'stale_revision', current} | {'bad_argument', what}
local job, lease, leases, events, text, ledger = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local to_state = ARGV[3]

if to_state ~= 'done' and to_state ~= 'failed' then
  return { 'bad_argument', 'state ' .. to_state }
end
local refused = fence(job, lease, ARGV[1], { running = true, stalled = true })
  or check_revision(job, ARGV[2])
if refused then
  return refused
end

local now = now_ms()
redis.call('HSET', job, 'state', to_state, 'finish_reason', ARGV[4], 'error', ARGV[5],
  'finished_ms', fmt(now))
local rev = bump(job, now)
redis.call('DEL', lease)
redis.call('ZREM', leases, redis.call('HGET', job, 'id'))
if ARGV[6] ~= '' then
  redis.call('RPUSH', ledger, ARGV[6])
end
event(events, rev, 'state', to_state, 'finish_reason', ARGV[4], 'error', ARGV[5])
retire(ARGV[7], job, text, events, ledger)
return { 'ok', fmt(rev) }
