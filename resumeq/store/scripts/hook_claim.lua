-- hook_claim: a hook run takes the hook's lease before it calls the hook, so that a janitor
-- can tell a run in progress from one whose worker died (the lease expires). A hook that
-- ran already is not run again.
-- KEYS[1] job hash   KEYS[2] hook lease
-- ARGV[1] hook name   ARGV[2] token   ARGV[3] lease TTL (ms)
-- Answers: {'ok'} | {'done'} | {'busy'} | {'not_found'} | {'wrong_state', state}
--   | {'corrupt', field}
local job, lease = KEYS[1], KEYS[2]

local refused, state = expect_state(job, { done = true })
if refused then
  return refused
end
if redis.call('HGET', job, 'hook_done:' .. ARGV[1]) then
  return { 'done' }
end
if not redis.call('SET', lease, ARGV[2], 'NX', 'PX', tonumber(ARGV[3])) then
  if redis.call('GET', lease) == ARGV[2] then
    return { 'ok' }  -- sent again after its reply was lost
  end
  return { 'busy' }
end
return { 'ok' }
