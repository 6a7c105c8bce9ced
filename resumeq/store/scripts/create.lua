-- create: write a job record before the first call (state queued, cursor 0, revision 0),
-- with its first attempt in the outbox.
-- KEYS[1] job hash   KEYS[2] queued zset   KEYS[3] outbox hash   KEYS[4] outbox zset
-- KEYS[5] totals hash   KEYS[6] every job by creation time   KEYS[7] idempotency key
-- (optional)
-- ARGV[1] job id   ARGV[2] spec JSON   ARGV[3] prompt hash   ARGV[4] budget tokens
-- ARGV[5] floor tokens   ARGV[6] queue name   ARGV[7] idempotency key as given
-- ARGV[8] request id   ARGV[9] the principal that creates it ('' for none: the HTTP
--   service's producers see only the jobs they created)
-- ARGV[10] a hash of the request that created it ('' for none: what the HTTP service
--   compares a repeated Idempotency-Key's body with, whatever became of the job since)
-- Answers: {'created', id, the outbox entry of its first attempt (its committer carries it
--   out at once)} | {'created', id} (a re-send of a create that was applied: what became of
--   its entry since is not known here) | {'exists', id} | {'idempotency_conflict', id} |
--   {'id_taken', id}
local job, queued, outbox, pending, totals = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local all_jobs, idem = KEYS[6], KEYS[7]
local id, hash, queue = ARGV[1], ARGV[3], ARGV[6]

if replayed(job, ARGV[8]) then
  return { 'created', id }
end
if idem then
  local bound = redis.call('GET', idem)
  if bound then
    local sep = string.find(bound, ':', 1, true)
    local bound_id, bound_hash = string.sub(bound, 1, sep - 1), string.sub(bound, sep + 1)
    -- The key lives exactly as long as its job: it expires with it, and purge deletes it.
    if bound_hash ~= hash then
      return { 'idempotency_conflict', bound_id }
    end
    return { 'exists', bound_id }
  end
end
if redis.call('EXISTS', job) == 1 then
  return { 'id_taken', id }
end

local now = now_ms()
redis.call('HSET', job,
  'id', id, 'spec', ARGV[2], 'prompt_hash', hash, 'state', 'queued', 'queue', queue,
  'budget_tokens', ARGV[4], 'floor_tokens', ARGV[5], 'spent_output_tokens', '0',
  'counts_exact', '1', 'revision', '0', 'attempt', '0', 'spill_count', '0',
  'created_ms', fmt(now), 'updated_ms', fmt(now))
stamp(job, ARGV[8])
if ARGV[9] and ARGV[9] ~= '' then
  redis.call('HSET', job, 'owner', ARGV[9])
end
if ARGV[10] and ARGV[10] ~= '' then
  redis.call('HSET', job, 'request_hash', ARGV[10])
end
redis.call('ZADD', queued, fmt(now), id)
redis.call('ZADD', all_jobs, fmt(now), id)
redis.call('HINCRBY', totals, 'jobs:created', 1)
local first = next_attempt_due(job, outbox, pending, id, queue, '1', now, now)
if idem then
  -- No TTL while the job lives: the key expires with the job (see retire_idempotency).
  redis.call('SET', idem, id .. ':' .. hash)
  redis.call('HSET', job, 'idempotency_key', ARGV[7])
end
return { 'created', id, first }
