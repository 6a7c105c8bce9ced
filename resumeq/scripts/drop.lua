-- drop: an operator gives up on a spilled job (spilled -> dropped, terminal); its partial
-- text stays readable until the retention runs out.
-- KEYS[1] job hash   KEYS[2] spilled zset   KEYS[3] events stream   KEYS[4] text
-- KEYS[5] ledger list
-- ARGV[1] reason   ARGV[2] retention (s)
-- Answers: {'ok', revision} | {'not_found'} | {'wrong_state', state}
local job, spilled, events, text, ledger = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]

local refused = expect_state(job, { spilled = true })
if refused then
  return refused
end
local now = now_ms()
redis.call('HSET', job, 'state', 'dropped', 'reason', ARGV[1], 'finished_ms', fmt(now))
local rev = bump(job, now)
redis.call('ZREM', spilled, redis.call('HGET', job, 'id'))
event(events, rev, 'state', 'dropped', 'reason', ARGV[1])
retire(ARGV[2], job, text, events, ledger)
return { 'ok', fmt(rev) }
