-- flush: the checkpoint, in one round trip. Checks the fencing token and the expected
-- revision, APPENDs the delta to the prefix (never rewrites it), spent + n, revision + 1,
-- XADDs the event, and extends the lease (a flush is proof of life). The owner of a
-- stalled job (a janitor) flushes a dead attempt's estimated count this way. A flush sent
-- again after its reply was lost answers as it did.
-- KEYS[1] job hash   KEYS[2] text   KEYS[3] lease   KEYS[4] events stream
-- KEYS[5] leases zset
-- ARGV[1] fencing token   ARGV[2] expected revision   ARGV[3] delta text
-- ARGV[4] output tokens in the delta (never negative: no write lowers the cursor)
-- ARGV[5] '1' if this attempt's total is exact after the flush, '0' if it is an estimate
-- ARGV[6] lease TTL (ms), 0 to leave the lease alone   ARGV[7] request id
-- ARGV[8] bytes of output that is not text (reasoning) in this span, for estimates
-- ARGV[9] the background response this text comes from ('' : none)
-- ARGV[10] the last event number of it whose output the text includes ('' : the text
--   matches no event)   ARGV[11] the provider and model it was made for
-- ARGV[12] '1' to mark the event held: followers show it once a replica holds it (a
--   'durable' marker at its revision or later; [store] durability = "replica")
-- ARGV[13] the answer's tool calls as they stand after this flush, as JSON ('' : unchanged)
-- ARGV[14] the calls this flush makes complete, as a JSON list ('' : none): the event
--   carries them, and followers show them
-- ARGV[15] the provider's refusal ('' : none)
-- Answers: {'ok', revision, spent, prefix bytes} | {'not_found'} | {'cancelled'}
--   | {'lease_lost', state} | {'wrong_state', state} | {'stale_revision', current}
--   | {'bad_argument', what} | {'corrupt', field}
local job, text, lease, events, leases = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local delta, ttl = ARGV[3], tonumber(ARGV[6])

if replayed(job, ARGV[7]) then
  return { 'ok', redis.call('HGET', job, 'revision'), redis.call('HGET', job, 'spent_output_tokens'),
    fmt(redis.call('STRLEN', text)) }
end
local refused = fence(job, lease, ARGV[1], { running = true, stalled = true })
  or check_revision(job, ARGV[2])
if refused then
  return refused
end

local tokens = tonumber(ARGV[4])
if not tokens or tokens < 0 or tokens ~= math.floor(tokens) then
  return { 'bad_argument', 'a flush never lowers the cursor: tokens ' .. ARGV[4] }
end

local now = now_ms()
local size = redis.call('APPEND', text, delta)
local spent = redis.call('HINCRBY', job, 'spent_output_tokens', ARGV[4])
if tonumber(ARGV[8]) and tonumber(ARGV[8]) > 0 then
  redis.call('HINCRBY', job, 'attempt_hidden_bytes', ARGV[8])
end
-- The job's counts are exact when every attempt's are: an exact flush restores what the
-- earlier attempts left (exact_base, set at acquire), an estimated one clears it.
if ARGV[5] == '1' then
  redis.call('HSET', job, 'counts_exact', redis.call('HGET', job, 'exact_base') or '1')
else
  redis.call('HSET', job, 'counts_exact', '0')
end
if (ARGV[9] or '') == '' then
  if delta ~= '' then
    -- Text from no background response: whatever response the job had, the stored text
    -- no longer ends at an event of it.
    redis.call('HDEL', job, 'response_seq')
  end
else
  note_response(job, ARGV[9], ARGV[10] or '', ARGV[11] or '', fmt(size - string.len(delta)),
    fmt(spent - tokens))
end
if (ARGV[13] or '') ~= '' then
  redis.call('HSET', job, 'tool_calls', ARGV[13])
end
if (ARGV[15] or '') ~= '' then
  redis.call('HSET', job, 'refusal', ARGV[15])
end
stamp(job, ARGV[7])
local rev = bump(job, now)
local extra = ARGV[12] == '1' and { 'held', '1' } or {}
if (ARGV[14] or '') ~= '' then
  table.insert(extra, 'calls')
  table.insert(extra, ARGV[14])
end
event(events, rev, 'delta', delta, 'spent', fmt(spent), 'exact', ARGV[5], unpack(extra))
if ttl > 0 then
  redis.call('PEXPIRE', lease, ttl)
  redis.call('ZADD', leases, fmt(now + ttl), redis.call('HGET', job, 'id'))
end
return { 'ok', fmt(rev), fmt(spent), fmt(size) }
