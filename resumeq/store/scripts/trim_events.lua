-- trim_events: a job ended a while ago (the grace its followers had to read its events):
-- keep its text once, and compactly. The events stream goes (even one entry would keep a
-- whole stream node, some 4 KB); the job hash keeps where each text delta ended in the
-- text, so a follower that comes later — from the start or after any revision — reads the
-- text it has not seen from the text key. The text, grown by APPENDs with room to spare,
-- is written again, compressed when the caller could make it smaller; fields only a
-- running job needs are dropped.
-- KEYS[1] job hash   KEYS[2] events stream   KEYS[3] text   KEYS[4] ended zset
-- ARGV[1] job id   ARGV[2] the text's length the caller read
-- ARGV[3] that text compressed ('' to store it as it is)
-- Answers: {'ok', entries removed} | {'not_found'} | {'not_ended', state}
--   | {'already_trimmed'} | {'corrupt', 'events'} (the stream does not add up to the text)
local job, events, text, ended_index = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local id = ARGV[1]

local state = redis.call('HGET', job, 'state')
if not state then
  redis.call('ZREM', ended_index, id) -- expired, or purged: nothing left to trim
  return { 'not_found' }
end
if not TERMINAL[state] then
  redis.call('ZREM', ended_index, id)
  return { 'not_ended', state }
end
if redis.call('HEXISTS', job, 'events_trimmed') == 1 then
  redis.call('ZREM', ended_index, id)
  return { 'already_trimmed' }
end
-- "rev:end rev:end …": after revision rev the text was end bytes long (text deltas only).
local offsets, size, count = {}, 0, 0
local cursor = '-'
while true do
  local batch = redis.call('XRANGE', events, cursor, '+', 'COUNT', 500)
  if #batch == 0 then
    break
  end
  for _, entry in ipairs(batch) do
    local fields = entry[2]
    local rev, delta = nil, nil
    for i = 1, #fields, 2 do
      if fields[i] == 'rev' then
        rev = fields[i + 1]
      elseif fields[i] == 'delta' then
        delta = fields[i + 1]
      end
    end
    if delta then
      size = size + #delta
      offsets[#offsets + 1] = rev .. ':' .. fmt(size)
    end
    count = count + 1
  end
  cursor = '(' .. batch[#batch][1]
end
if size ~= redis.call('STRLEN', text) then
  -- the stream does not account for the text: keep both rather than guess
  redis.call('ZREM', ended_index, id)
  return { 'corrupt', 'events' }
end
redis.call('HSET', job, 'events_trimmed', redis.call('HGET', job, 'revision'),
  'text_offsets', table.concat(offsets, ' '))
redis.call('HDEL', job, 'lease_token', 'last_write', 'attempt_spent_base', 'attempt_text_base',
  'attempt_hidden_bytes', 'exact_base', 'stalled_owner', 'failures', 'failing_since_ms',
  'durable_revision')
redis.call('DEL', events)
if ARGV[3] ~= '' and size == tonumber(ARGV[2]) then
  redis.call('SET', text, ARGV[3], 'KEEPTTL')
elseif size > 0 then
  redis.call('SET', text, redis.call('GET', text), 'KEEPTTL')
end
redis.call('ZREM', ended_index, id)
return { 'ok', fmt(count) }
