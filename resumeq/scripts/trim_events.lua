-- trim_events: a job ended a while ago (the grace its last followers had to read its
-- events): its text is kept once, not twice. The events stream is cut to its last entry
-- (the terminal state), and the job hash keeps where each text delta ended in the text,
-- so a follower that comes later — from the start or after any revision — reads the text
-- it has not seen from the text key instead.
-- KEYS[1] job hash   KEYS[2] events stream   KEYS[3] ended zset
-- ARGV[1] job id
-- Answers: {'ok', entries removed} | {'not_found'} | {'not_ended', state}
--   | {'already_trimmed'}
local job, events, ended_index = KEYS[1], KEYS[2], KEYS[3]
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
if redis.call('HEXISTS', job, 'events_from') == 1 then
  redis.call('ZREM', ended_index, id)
  return { 'already_trimmed' }
end
-- "rev:end rev:end …": after revision rev the text was end bytes long (text deltas only).
local offsets, size, last_rev, count = {}, 0, nil, 0
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
    last_rev = rev
    count = count + 1
  end
  cursor = '(' .. batch[#batch][1]
end
if not last_rev then
  redis.call('ZREM', ended_index, id)
  return { 'ok', '0' }
end
redis.call('HSET', job, 'events_from', last_rev, 'text_offsets', table.concat(offsets, ' '))
redis.call('XTRIM', events, 'MAXLEN', 1)
redis.call('ZREM', ended_index, id)
return { 'ok', fmt(count - 1) }
