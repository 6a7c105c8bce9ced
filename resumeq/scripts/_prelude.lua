-- prelude: shared helpers, prepended to every resumeq script when it is registered.
-- Scripts answer with a table whose first element is a status string; the Python side
-- turns every status into a typed result or a typed exception.

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function fmt(n)
  return string.format('%d', n)
end

local TERMINAL = { done = true, failed = true, cancelled = true, abandoned = true, dropped = true }

-- A durable write of the job: revision + 1 and the update time; answers the new revision.
local function bump(job, now)
  local rev = redis.call('HINCRBY', job, 'revision', 1)
  redis.call('HSET', job, 'updated_ms', fmt(now))
  return rev
end

-- Every revision has an entry in the events stream; followers read these.
local function event(events, rev, ...)
  redis.call('XADD', events, '*', 'rev', fmt(rev), ...)
end

-- A terminal job and everything it owns expire after the retention.
local function retire(retention_s, ...)
  local ttl = tonumber(retention_s)
  if ttl and ttl > 0 then
    for _, key in ipairs({ ... }) do
      redis.call('EXPIRE', key, ttl)
    end
  end
end

-- A record edited by hand must be refused before anything is written: Redis does not
-- roll a script back when it fails half way. Answers the refusal, or nil.
local NUMERIC = { 'revision', 'attempt', 'spent_output_tokens', 'spill_count', 'budget_tokens' }
local function corrupt(job)
  for _, field in ipairs(NUMERIC) do
    local value = redis.call('HGET', job, field)
    if not value or not string.match(value, '^%-?%d+$') then
      return { 'corrupt', field }
    end
  end
  return nil
end

-- The checks every fenced write makes, in order: the job exists, it was not cancelled,
-- the caller's token is the lease, the job is in one of the allowed states. Answers nil
-- when all pass, else the refusal to return.
local function fence(job, lease, token, allowed)
  local state = redis.call('HGET', job, 'state')
  if not state then
    return { 'not_found' }
  end
  if state == 'cancelled' then
    return { 'cancelled' }
  end
  local bad = corrupt(job)
  if bad then
    return bad
  end
  if redis.call('GET', lease) ~= token then
    return { 'lease_lost', state }
  end
  if not allowed[state] then
    return { 'wrong_state', state }
  end
  return nil
end

-- The job exists and is in one of the allowed states (nil allows any non-terminal one).
-- Answers the refusal to return, or nil and the state.
local function expect_state(job, allowed)
  local state = redis.call('HGET', job, 'state')
  if not state then
    return { 'not_found' }
  end
  if (allowed and not allowed[state]) or (not allowed and TERMINAL[state]) then
    return { 'wrong_state', state }
  end
  local bad = corrupt(job)
  if bad then
    return bad
  end
  return nil, state
end

local function check_revision(job, expected)
  if expected ~= '' then
    local current = redis.call('HGET', job, 'revision')
    if current ~= expected then
      return { 'stale_revision', current }
    end
  end
  return nil
end

