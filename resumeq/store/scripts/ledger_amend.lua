-- ledger_amend: what a cancelled job's background response made past the cursor, counted
-- once the janitor has stopped it at the provider: added to the record of the attempt that
-- made the response (billed, never read: unread_output_tokens) and to the totals. Not
-- fenced (the job ended); at most once per response, whoever counts it first.
-- KEYS[1] job hash   KEYS[2] ledger list   KEYS[3] totals   KEYS[4] the provider's totals
-- KEYS[5] the day's totals
-- ARGV[1] response id   ARGV[2] output tokens   ARGV[3] the totals they add (JSON)
-- Answers: {'ok'} | {'counted'} | {'not_found'} | {'no_record'} | {'bad_argument', what}
local job, ledger, totals, by_provider, day = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]

local tokens = tonumber(ARGV[2])
if not tokens or tokens < 0 or tokens ~= math.floor(tokens) or ARGV[1] == '' then
  return { 'bad_argument', 'a response id and a count of at least 0' }
end
if redis.call('EXISTS', job) == 0 then
  return { 'not_found' }
end
-- The record of the attempt that made the response (the latest record, where none is).
local made = tonumber(redis.call('HGET', job, 'response_attempt') or '')
local count = redis.call('LLEN', ledger)
if count == 0 then
  return { 'no_record' }
end
local index = count - 1
for i = count - 1, math.max(0, count - 64), -1 do
  local ok, entry = pcall(cjson.decode, redis.call('LINDEX', ledger, i))
  if ok and made and tonumber(entry['attempt']) == made then
    index = i
    break
  end
end
if not count_response_once(job, ARGV[1]) then
  return { 'counted' }
end
local ok, entry = pcall(cjson.decode, redis.call('LINDEX', ledger, index))
if not ok then
  return { 'no_record' }
end
entry['unread_output_tokens'] = (tonumber(entry['unread_output_tokens']) or 0) + tokens
redis.call('LSET', ledger, index, cjson.encode(entry))
add_totals(totals, by_provider, ARGV[3], day)
return { 'ok' }
