-- reap: a janitor takes over a running job whose lease is gone (running -> stalled) with
-- a lease of its own, so that it can apply the gate through release/finish like a worker.
-- A stalled job whose janitor died in turn is reaped again. Stale zset entries are removed.
-- KEYS[1] job hash   KEYS[2] lease   KEYS[3] leases zset   KEYS[4] events stream
-- KEYS[5] running zset   KEYS[6] stalled zset
-- ARGV[1] job id   ARGV[2] janitor id   ARGV[3] nonce (also the request id)
-- ARGV[4] lease TTL (ms)
-- ARGV[5] the fencing token of an owner known dead before its lease expired (its worker's
--   connections all closed), or '': a lease still holding that token is taken over as if
--   it had expired (a live owner's next write is refused: it stops, and the job goes on
--   from its last checkpoint)
-- Answers: {'ok', token, deadline, <job hash as field, value, ...>} | {'not_found'}
--   | {'not_running', state} | {'alive', deadline} | {'corrupt', field}
local job, lease, leases, events, running, stalled = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local id, ttl = ARGV[1], tonumber(ARGV[4])

local function answer(token, deadline)
  local out = { 'ok', token, deadline }
  for _, v in ipairs(redis.call('HGETALL', job)) do
    out[#out + 1] = v
  end
  return out
end

if replayed(job, ARGV[3]) and redis.call('HGET', job, 'state') == 'stalled' then
  local deadline = redis.call('ZSCORE', leases, id)
  return answer(redis.call('HGET', job, 'lease_token'), fmt(tonumber(deadline) or now_ms()))
end
local state = redis.call('HGET', job, 'state')
if not state then
  redis.call('ZREM', leases, id)
  return { 'not_found' }
end
if state ~= 'running' and state ~= 'stalled' then
  redis.call('ZREM', leases, id)
  return { 'not_running', state }
end
local bad = corrupt(job) or corrupt_spec(job)
if bad then
  return bad
end
local now = now_ms()
local pttl = redis.call('PTTL', lease)
local dead = ARGV[5] or ''
if pttl > 0 and (dead == '' or redis.call('GET', lease) ~= dead) then
  local deadline = fmt(now + pttl)
  redis.call('ZADD', leases, deadline, id)
  return { 'alive', deadline }
end

-- No lease (or one without a TTL, which would never expire): the owner is gone.
local attempt = redis.call('HGET', job, 'attempt')
local token = attempt .. ':' .. ARGV[2] .. ':' .. ARGV[3]
redis.call('SET', lease, token, 'PX', ttl)
if state == 'running' then
  -- Remember whose attempt died, for its ledger record.
  redis.call('HSET', job, 'stalled_owner', redis.call('HGET', job, 'lease_token') or '')
end
redis.call('HSET', job, 'state', 'stalled', 'lease_token', token)
stamp(job, ARGV[3])
local rev = bump(job, now)
local deadline = fmt(now + ttl)
redis.call('ZADD', leases, deadline, id)
redis.call('ZREM', running, id)
redis.call('ZADD', stalled, fmt(now), id)
event(events, rev, 'state', 'stalled')
return answer(token, deadline)
