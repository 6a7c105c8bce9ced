-- ledger_append: the record of an attempt that ended without an exit of its own — stopped
-- by a cancel, fenced out, its job purged — with what it received. Not fenced: written at
-- most once per attempt (an attempt whose exit, or a janitor, recorded it is left alone).
-- KEYS[1] job hash   KEYS[2] ledger list   KEYS[3] totals   KEYS[4] the provider's totals
-- KEYS[5] the day's totals
-- ARGV[1] attempt number   ARGV[2] ledger record JSON   ARGV[3] its totals (JSON)
-- ARGV[4] a background response whose output the record counts past the cursor ('' : none)
-- Answers: {'ok'} | {'recorded'} | {'not_found'}
local job, ledger, totals, by_provider, day = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]

if redis.call('EXISTS', job) == 0 then
  return { 'not_found' }
end
if not record_attempt(job, ledger, ARGV[1], ARGV[2]) then
  return { 'recorded' }
end
count_response_once(job, ARGV[4] or '')
add_totals(totals, by_provider, ARGV[3], day)
return { 'ok' }
