-- drop: an operator gives up on a spilled job (spilled -> dropped, terminal); its partial
-- text stays readable until the retention runs out. Its spill-lane attempt is cleared
-- from the outbox.
-- KEYS[1] job hash   KEYS[2] spilled zset   KEYS[3] events stream   KEYS[4] text
-- KEYS[5] ledger list   KEYS[6] outbox hash   KEYS[7] outbox zset   KEYS[8] ended zset
-- KEYS[9] totals   KEYS[10] idempotency key (optional)
-- ARGV[1] reason   ARGV[2] retention (s)   ARGV[3] request id
-- Answers: {'ok', revision} | {'not_found'} | {'wrong_state', state} | {'corrupt', field}
local job, spilled, events, text, ledger = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local outbox, pending, ended_index, totals, idem = KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[10]

if replayed(job, ARGV[3]) then
  return { 'ok', redis.call('HGET', job, 'revision') }
end
local refused = expect_state(job, { spilled = true })
if refused then
  return refused
end
local now = now_ms()
local id = redis.call('HGET', job, 'id')
redis.call('HSET', job, 'state', 'dropped', 'reason', ARGV[1], 'finished_ms', fmt(now))
stamp(job, ARGV[3])
local rev = bump(job, now)
redis.call('ZREM', spilled, id)
ended(totals, ended_index, id, 'dropped', now, job)
outbox_clear(outbox, pending, id)
event(events, rev, 'state', 'dropped', 'reason', ARGV[1])
retire(ARGV[2], job, text, events, ledger)
retire_idempotency(idem, id, ARGV[2])
return { 'ok', fmt(rev) }
