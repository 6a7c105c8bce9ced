-- release: the owner (a worker after a cut, or a janitor after a reap) applies the gate's
-- exit: back to queued for a retry or continuation, abandoned (terminal, partial text
-- kept) or spilled (at most once per job). Appends the attempt's ledger record. The next
-- attempt (on the job's queue, after the delay; or on the spill lane) goes into the
-- outbox in the same step: it is enqueued even if the owner dies right after.
-- KEYS[1] job hash   KEYS[2] lease   KEYS[3] leases zset   KEYS[4] events stream
-- KEYS[5] queued zset   KEYS[6] spilled zset   KEYS[7] text   KEYS[8] ledger list
-- KEYS[9] outbox hash   KEYS[10] outbox zset   KEYS[11] running zset   KEYS[12] stalled zset
-- KEYS[13] ended zset   KEYS[14] totals   KEYS[15] the provider's totals
-- KEYS[16] the day's totals   KEYS[17] idempotency key (optional)
-- ARGV[1] fencing token   ARGV[2] expected revision ('' for any)
-- ARGV[3] 'queued' | 'abandoned' | 'spilled'   ARGV[4] reason
-- ARGV[5] ledger record JSON ('' for none)   ARGV[6] retention (s)   ARGV[7] request id
-- ARGV[8] the next attempt's delay (ms)   ARGV[9] the spill lane's queue
-- ARGV[10] the ledger record's totals (JSON)
-- ARGV[11] '1' if the attempt delivered output, '0' if it delivered nothing (a failure:
--   the run of such attempts, and since when, is kept for the gate's pacing)
-- ARGV[12] '1' to let the answer go before a fresh attempt (on_invalid = retry: the text
--   and tool calls are deleted, the cursor stays; the event says 'reset')
-- Answers: {'ok', revision} | {'not_found'} | {'cancelled'} | {'lease_lost', state}
--   | {'wrong_state', state} | {'stale_revision', current} | {'spill_exhausted'}
--   | {'bad_argument', what} | {'corrupt', field}
local job, lease, leases, events = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local queued, spilled, text, ledger = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local outbox, pending, running, stalled = KEYS[9], KEYS[10], KEYS[11], KEYS[12]
local ended_index, totals, by_provider, day, idem = KEYS[13], KEYS[14], KEYS[15], KEYS[16], KEYS[17]
local to_state = ARGV[3]

if to_state ~= 'queued' and to_state ~= 'abandoned' and to_state ~= 'spilled' then
  return { 'bad_argument', 'state ' .. to_state }
end
if replayed(job, ARGV[7]) then
  return { 'ok', redis.call('HGET', job, 'revision') }
end
local refused = fence(job, lease, ARGV[1], { running = true, stalled = true })
  or check_revision(job, ARGV[2])
if refused then
  return refused
end
if to_state == 'spilled' and tonumber(redis.call('HGET', job, 'spill_count')) >= 1 then
  return { 'spill_exhausted' }
end

local now = now_ms()
local id = redis.call('HGET', job, 'id')
local next_attempt = fmt(tonumber(redis.call('HGET', job, 'attempt')) + 1)
redis.call('HSET', job, 'state', to_state, 'reason', ARGV[4])
if ARGV[11] == '0' then
  if not redis.call('HGET', job, 'failing_since_ms') then
    redis.call('HSET', job, 'failing_since_ms',
      redis.call('HGET', job, 'attempt_started_ms') or fmt(now))
  end
  redis.call('HINCRBY', job, 'failures', 1)
else
  redis.call('HDEL', job, 'failing_since_ms')
  redis.call('HSET', job, 'failures', '0')
end
stamp(job, ARGV[7])
local rev = bump(job, now)
redis.call('DEL', lease)
redis.call('ZREM', leases, id)
redis.call('ZREM', running, id)
redis.call('ZREM', stalled, id)
if record_attempt(job, ledger, redis.call('HGET', job, 'attempt'), ARGV[5]) then
  add_totals(totals, by_provider, ARGV[10], day)
end
if to_state == 'queued' then
  redis.call('ZADD', queued, fmt(now), id)
  redis.call('HSET', job, 'cut_ms', fmt(now))  -- a continuation's latency counts from here
  local due = now + (tonumber(ARGV[8]) or 0)
  next_attempt_due(job, outbox, pending, id, redis.call('HGET', job, 'queue'), next_attempt, due, now)
elseif to_state == 'spilled' then
  redis.call('HINCRBY', job, 'spill_count', 1)
  redis.call('HSET', job, 'spilled_ms', fmt(now))
  redis.call('ZADD', spilled, fmt(now), id)
  next_attempt_due(job, outbox, pending, id, ARGV[9], next_attempt, now, now)
else
  redis.call('HSET', job, 'finished_ms', fmt(now))
  ended(totals, ended_index, id, to_state, now, job)
  outbox_clear(outbox, pending, id)
  retire(ARGV[6], job, text, events, ledger)
  retire_idempotency(idem, id, ARGV[6])
end
if ARGV[12] == '1' and to_state == 'queued' then
  redis.call('DEL', text)
  redis.call('HSET', job, 'answer_base', redis.call('HGET', job, 'spent_output_tokens'))
  redis.call('HDEL', job, 'tool_calls', 'refusal', 'response_id', 'response_seq', 'response_for',
    'response_attempt', 'response_spent_base', 'response_text_base')
  event(events, rev, 'state', to_state, 'reason', ARGV[4], 'reset', '1')
else
  event(events, rev, 'state', to_state, 'reason', ARGV[4])
end
return { 'ok', fmt(rev) }
