-- acquire: take a queued job's lease (SET NX PX) with a fresh fencing token; attempt + 1,
-- queued -> running, deadline into the leases zset. The outbox entry that enqueued this
-- attempt has evidently been done: it is removed.
-- KEYS[1] job hash   KEYS[2] lease   KEYS[3] leases zset   KEYS[4] queued zset
-- KEYS[5] events stream   KEYS[6] text   KEYS[7] outbox hash   KEYS[8] outbox zset
-- KEYS[9] running zset
-- ARGV[1] worker id   ARGV[2] nonce (also the request id)   ARGV[3] lease TTL (ms)
-- ARGV[4] prompt hash the caller will generate for ('' to skip the check)
-- Answers: {'ok', token, deadline, <job hash as field, value, ...>} | {'not_found'}
--   | {'wrong_state', state} | {'busy'} | {'conflict', stored hash} | {'corrupt', field}
local job, lease, leases, queued = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local events, text, outbox, pending, running = KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9]
local ttl = tonumber(ARGV[3])

local function answer(token, deadline)
  local out = { 'ok', token, deadline }
  for _, v in ipairs(redis.call('HGETALL', job)) do
    out[#out + 1] = v
  end
  return out
end

if replayed(job, ARGV[2]) and redis.call('HGET', job, 'state') == 'running' then
  local deadline = redis.call('ZSCORE', leases, redis.call('HGET', job, 'id'))
  return answer(redis.call('HGET', job, 'lease_token'), fmt(tonumber(deadline) or now_ms()))
end
local refused = expect_state(job, { queued = true }) or corrupt_spec(job)
if refused then
  return refused
end
local stored_hash = redis.call('HGET', job, 'prompt_hash')
if ARGV[4] ~= '' and stored_hash ~= ARGV[4] then
  return { 'conflict', stored_hash }
end
local attempt = tonumber(redis.call('HGET', job, 'attempt')) + 1
local token = fmt(attempt) .. ':' .. ARGV[1] .. ':' .. ARGV[2]
if not redis.call('SET', lease, token, 'NX', 'PX', ttl) then
  return { 'busy' }
end

local now = now_ms()
local id = redis.call('HGET', job, 'id')
-- Where this attempt starts: what a janitor needs to account for it if it dies.
redis.call('HSET', job, 'state', 'running', 'lease_token', token, 'attempt', fmt(attempt),
  'exact_base', redis.call('HGET', job, 'counts_exact'),
  'attempt_spent_base', redis.call('HGET', job, 'spent_output_tokens'),
  'attempt_text_base', fmt(redis.call('STRLEN', text)), 'attempt_hidden_bytes', '0',
  'attempt_started_ms', fmt(now))
stamp(job, ARGV[2])
local rev = bump(job, now)
local deadline = fmt(now + ttl)
redis.call('ZADD', leases, deadline, id)
redis.call('ZREM', queued, id)
redis.call('ZADD', running, fmt(now), id)
local entry = redis.call('HGET', outbox, 'attempt')
if entry and tonumber(string.match(entry, '^[^|]*|(%d+)|')) <= attempt then
  redis.call('HDEL', outbox, 'attempt')
  if redis.call('HLEN', outbox) == 0 then
    redis.call('ZREM', pending, id)
  end
end
event(events, rev, 'state', 'running', 'attempt', fmt(attempt))
return answer(token, deadline)
