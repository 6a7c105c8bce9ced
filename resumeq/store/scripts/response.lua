-- response: note the background response the caller's attempt made, as soon as the
-- provider names it (before any of its output: a worker that dies then leaves a response
-- the next attempt reads on, not one nobody reads), or forget the one the job has (it
-- cannot be read on: too old, gone, failed, made for another provider or model). The
-- text, the cursor and the revision do not change.
-- KEYS[1] job hash   KEYS[2] lease   KEYS[3] text
-- ARGV[1] fencing token   ARGV[2] 'note' | 'forget'   ARGV[3] response id
-- ARGV[4] last event number whose output the stored text includes ('' : none)
-- ARGV[5] the provider and model it was made for
-- Answers: {'ok'} | {'not_found'} | {'cancelled'} | {'lease_lost', state}
--   | {'wrong_state', state} | {'bad_argument', what} | {'corrupt', field}
local job, lease, text = KEYS[1], KEYS[2], KEYS[3]

local refused = fence(job, lease, ARGV[1], { running = true })
if refused then
  return refused
end
if ARGV[2] == 'forget' then
  redis.call('HDEL', job, 'response_id', 'response_for', 'response_attempt',
    'response_spent_base', 'response_text_base', 'response_seq')
  return { 'ok' }
end
if ARGV[2] ~= 'note' or ARGV[3] == '' then
  return { 'bad_argument', 'response: note needs an id, or forget' }
end
note_response(job, ARGV[3], ARGV[4], ARGV[5], fmt(redis.call('STRLEN', text)),
  redis.call('HGET', job, 'spent_output_tokens') or '0')
return { 'ok' }
