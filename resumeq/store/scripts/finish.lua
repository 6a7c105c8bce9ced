-- finish: the owner ends the job as done or failed, appends its attempt's ledger record,
-- drops the lease and starts the retention clock. A done job with hooks gets them in its
-- outbox, in the same step: they run even if the owner dies right after.
-- KEYS[1] job hash   KEYS[2] lease   KEYS[3] leases zset   KEYS[4] events stream
-- KEYS[5] text   KEYS[6] ledger list   KEYS[7] outbox hash   KEYS[8] outbox zset
-- KEYS[9] running zset   KEYS[10] stalled zset   KEYS[11] ended zset   KEYS[12] totals
-- KEYS[13] the provider's totals   KEYS[14] the day's totals   KEYS[15] idempotency key
-- (optional)
-- ARGV[1] fencing token   ARGV[2] expected revision ('' for any)   ARGV[3] 'done' | 'failed'
-- ARGV[4] finish reason   ARGV[5] error   ARGV[6] ledger record JSON ('' for none)
-- ARGV[7] retention (s)   ARGV[8] request id   ARGV[9] the ledger record's totals (JSON)
-- ARGV[10..] the job's hooks (their names)
-- Answers: {'ok', revision} | {'not_found'} | {'cancelled'} | {'lease_lost', state}
--   | {'wrong_state', state} | {'stale_revision', current} | {'bad_argument', what}
--   | {'corrupt', field}
local job, lease, leases, events, text, ledger = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local outbox, pending, running, stalled = KEYS[7], KEYS[8], KEYS[9], KEYS[10]
local ended_index, totals, by_provider, day, idem = KEYS[11], KEYS[12], KEYS[13], KEYS[14], KEYS[15]
local to_state = ARGV[3]

if to_state ~= 'done' and to_state ~= 'failed' then
  return { 'bad_argument', 'state ' .. to_state }
end
if replayed(job, ARGV[8]) then
  return { 'ok', redis.call('HGET', job, 'revision') }
end
local refused = fence(job, lease, ARGV[1], { running = true, stalled = true })
  or check_revision(job, ARGV[2])
if refused then
  return refused
end

local now = now_ms()
local id = redis.call('HGET', job, 'id')
redis.call('HSET', job, 'state', to_state, 'finish_reason', ARGV[4], 'error', ARGV[5],
  'finished_ms', fmt(now))
if to_state == 'done' then
  redis.call('HDEL', job, 'failing_since_ms')
  redis.call('HSET', job, 'failures', '0')
end
stamp(job, ARGV[8])
local rev = bump(job, now)
redis.call('DEL', lease)
redis.call('ZREM', leases, id)
redis.call('ZREM', running, id)
redis.call('ZREM', stalled, id)
if record_attempt(job, ledger, redis.call('HGET', job, 'attempt'), ARGV[6]) then
  add_totals(totals, by_provider, ARGV[9], day)
end
ended(totals, ended_index, id, to_state, now, job)
redis.call('HDEL', outbox, 'attempt')
if to_state == 'done' and #ARGV >= 10 then
  -- One entry per hook, kept until the hook has run (hook_done): a run whose worker died
  -- is enqueued again. The value is the queue and how often it was enqueued again.
  local queue = redis.call('HGET', job, 'queue')
  for i = 10, #ARGV do
    outbox_add(outbox, pending, id, 'hook:' .. ARGV[i], queue .. '|0', now)
  end
elseif redis.call('HLEN', outbox) == 0 then
  redis.call('ZREM', pending, id)
end
event(events, rev, 'state', to_state, 'finish_reason', ARGV[4], 'error', ARGV[5])
retire(ARGV[7], job, text, events, ledger, outbox)
retire_idempotency(idem, id, ARGV[7])
return { 'ok', fmt(rev) }
