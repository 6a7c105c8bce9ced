-- renew: extend the caller's lease; refused once the token is no longer the lease.
-- KEYS[1] job hash   KEYS[2] lease   KEYS[3] leases zset
-- ARGV[1] fencing token   ARGV[2] lease TTL (ms)
-- Answers: {'ok', deadline} | {'not_found'} | {'cancelled'} | {'lease_lost', state}
--   | {'wrong_state', state}
local job, lease, leases = KEYS[1], KEYS[2], KEYS[3]
local ttl = tonumber(ARGV[2])

local refused = fence(job, lease, ARGV[1], { running = true, stalled = true })
if refused then
  return refused
end
local deadline = fmt(now_ms() + ttl)
redis.call('PEXPIRE', lease, ttl)
redis.call('ZADD', leases, deadline, redis.call('HGET', job, 'id'))
return { 'ok', deadline }
