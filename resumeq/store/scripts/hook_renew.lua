-- hook_renew: a hook run that is still working extends its lease.
-- KEYS[1] hook lease
-- ARGV[1] token   ARGV[2] lease TTL (ms)
-- Answers: {'ok'} | {'lease_lost'}
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return { 'lease_lost' }
end
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]))
return { 'ok' }
