-- create: write a job record before the first call (state queued, cursor 0, revision 0).
-- KEYS[1] job hash   KEYS[2] queued zset   KEYS[3] idempotency key (optional)
-- ARGV[1] job id   ARGV[2] spec JSON   ARGV[3] prompt hash   ARGV[4] budget tokens
-- ARGV[5] floor tokens   ARGV[6] queue name   ARGV[7] idempotency TTL (s)
-- ARGV[8] idempotency key as given
-- Answers: {'created', id} | {'exists', id} | {'idempotency_conflict', id} | {'id_taken', id}
local job, queued, idem = KEYS[1], KEYS[2], KEYS[3]
local id, hash = ARGV[1], ARGV[3]

if idem then
  local bound = redis.call('GET', idem)
  if bound then
    local sep = string.find(bound, ':', 1, true)
    local bound_id, bound_hash = string.sub(bound, 1, sep - 1), string.sub(bound, sep + 1)
    if bound_hash ~= hash then
      return { 'idempotency_conflict', bound_id }
    end
    return { 'exists', bound_id }
  end
end
if redis.call('EXISTS', job) == 1 then
  return { 'id_taken', id }
end

local now = fmt(now_ms())
redis.call('HSET', job,
  'id', id, 'spec', ARGV[2], 'prompt_hash', hash, 'state', 'queued', 'queue', ARGV[6],
  'budget_tokens', ARGV[4], 'floor_tokens', ARGV[5], 'spent_output_tokens', '0',
  'counts_exact', '1', 'revision', '0', 'attempt', '0', 'spill_count', '0',
  'created_ms', now, 'updated_ms', now)
redis.call('ZADD', queued, now, id)
if idem then
  redis.call('SET', idem, id .. ':' .. hash, 'EX', ARGV[7])
  redis.call('HSET', job, 'idempotency_key', ARGV[8])
end
return { 'created', id }
