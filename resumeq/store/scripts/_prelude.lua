-- prelude: shared helpers, prepended to every resumeq script when it is registered.
-- Scripts answer with a table whose first element is a status string; the Python side
-- turns every status into a typed result or a typed exception.

local unpack = unpack or table.unpack

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

-- A terminal job and everything it owns expire after the retention (keys that do not
-- exist are skipped, so an optional key may be passed as nil or a name).
local function retire(retention_s, ...)
  local ttl = tonumber(retention_s)
  if ttl and ttl > 0 then
    for _, key in ipairs({ ... }) do
      redis.call('EXPIRE', key, ttl)
    end
  end
end

-- The idempotency key lives exactly as long as its job: it expires with it (and only if
-- it still names this job).
local function retire_idempotency(idem, id, retention_s)
  if idem then
    local bound = redis.call('GET', idem)
    if bound and string.sub(bound, 1, #id + 1) == id .. ':' then
      retire(retention_s, idem)
    end
  end
end

-- A record edited by hand must be refused before anything is written: Redis does not
-- roll a script back when it fails half way. Every field a script reads is checked here,
-- in one HMGET. Answers the refusal, or nil.
local STATES = { queued = true, running = true, stalled = true, spilled = true, done = true,
  failed = true, cancelled = true, abandoned = true, dropped = true }
local NUMERIC = { 'revision', 'attempt', 'spent_output_tokens', 'spill_count', 'budget_tokens' }
local TEXT = { 'id', 'queue', 'prompt_hash', 'spec' }
local CHECKED = { 'state', 'counts_exact', unpack(NUMERIC) }
for _, field in ipairs(TEXT) do
  CHECKED[#CHECKED + 1] = field
end
local function corrupt(job)
  local values = redis.call('HMGET', job, unpack(CHECKED))
  if not STATES[values[1]] then
    return { 'corrupt', 'state' }
  end
  if values[2] ~= '0' and values[2] ~= '1' then
    return { 'corrupt', 'counts_exact' }
  end
  for i, field in ipairs(NUMERIC) do
    local value = values[2 + i]
    if not value or not string.match(value, '^%-?%d+$') then
      return { 'corrupt', field }
    end
  end
  for i, field in ipairs(TEXT) do
    local value = values[2 + #NUMERIC + i]
    if not value or value == '' then
      return { 'corrupt', field }
    end
  end
  local id, queue, hash = values[3 + #NUMERIC], values[4 + #NUMERIC], values[5 + #NUMERIC]
  if not string.match(id, '^[%w_-]+$') then
    return { 'corrupt', 'id' }
  end
  if not string.match(queue, '^[%w][%w_.:-]*$') then
    return { 'corrupt', 'queue' }
  end
  if not string.match(hash, '^%x+$') then
    return { 'corrupt', 'prompt_hash' }
  end
  return nil
end

-- The spec is read back by whoever runs the attempt: it must at least be JSON (checked
-- where an attempt starts, not on every checkpoint).
local function corrupt_spec(job)
  local ok = pcall(cjson.decode, redis.call('HGET', job, 'spec'))
  if not ok then
    return { 'corrupt', 'spec' }
  end
  return nil
end

-- A job hash without a state is half deleted or edited by hand: corrupt, not missing.
local function missing_or_corrupt(job)
  if redis.call('EXISTS', job) == 1 then
    return { 'corrupt', 'state' }
  end
  return { 'not_found' }
end

-- A write whose reply was lost is sent again with the same request id. The id of the last
-- write applied is kept in the record: a re-sent write that was applied is recognised,
-- and answers as it did, instead of being refused (or applied twice). The recognition is
-- itself a write (the same id again), so that a WAIT after a re-send covers the first.
local function replayed(job, rid)
  if rid ~= '' and redis.call('HGET', job, 'last_write') == rid then
    redis.call('HSET', job, 'last_write', rid)
    return true
  end
  return false
end

local function stamp(job, rid)
  if rid ~= '' then
    redis.call('HSET', job, 'last_write', rid)
  end
end

-- One ledger record per attempt (whoever writes it: the worker at its exit, a janitor for a
-- dead attempt, a worker stopped by a cancel), and the running totals it adds to.
-- A background response's output counted into the ledger: at most once, whoever counts it
-- (the worker that saw its job cancelled, or a janitor that stopped it).
local function count_response_once(job, response)
  if not response or response == '' then
    return true
  end
  return redis.call('HSETNX', job, 'counted:' .. response, '1') == 1
end

local function record_attempt(job, ledger, attempt, entry)
  if entry == '' or redis.call('HSETNX', job, 'ledger:' .. attempt, '1') == 0 then
    return false
  end
  redis.call('RPUSH', ledger, entry)
  return true
end

-- ``day``: the same totals for the day (UTC) the record is written, kept DAY_TOTALS_TTL_S.
local DAY_TOTALS_TTL_S = 40 * 86400
local function add_totals(totals, by_provider, deltas, day)
  if deltas == '' then
    return
  end
  for field, n in pairs(cjson.decode(deltas)) do
    redis.call('HINCRBY', totals, field, n)
    if by_provider and by_provider ~= totals then
      redis.call('HINCRBY', by_provider, field, n)
    end
    if day then
      redis.call('HINCRBY', day, field, n)
    end
  end
  if day then
    redis.call('EXPIRE', day, DAY_TOTALS_TTL_S)
  end
end

-- A job reached a terminal state: counted (in all, and by its queue), and indexed until
-- its events are trimmed.
local function ended(totals, ended_index, id, state, now, job)
  redis.call('HINCRBY', totals, 'jobs:' .. state, 1)
  local queue = redis.call('HGET', job, 'queue')
  if queue then
    redis.call('HINCRBY', totals, 'queue_jobs:' .. queue .. ':' .. state, 1)
  end
  redis.call('ZADD', ended_index, fmt(now), id)
end

-- The outbox: what must follow a commit, written by the script that commits and completed
-- (idempotently) by the committer, or by a janitor if it died. A job's entries live in its
-- outbox hash; the global zset says which jobs have some, since when.
local function outbox_add(outbox, pending, id, field, value, now)
  redis.call('HSET', outbox, field, value)
  redis.call('ZADD', pending, 'NX', fmt(now), id)
end

-- The job's next attempt goes into its outbox, due at ``due`` (ms, this clock); the job
-- keeps the due time, which the attempt's ledger record reports (``due_ms``: from it to
-- the attempt's start is the time it waited for a worker). Answers the entry.
local function next_attempt_due(job, outbox, pending, id, queue, attempt, due, now)
  redis.call('HSET', job, 'due_ms', fmt(due))
  local entry = queue .. '|' .. attempt .. '|' .. fmt(due)
  outbox_add(outbox, pending, id, 'attempt', entry, now)
  return entry
end

local function outbox_clear(outbox, pending, id)
  redis.call('DEL', outbox)
  redis.call('ZREM', pending, id)
end

-- The checks every fenced write makes, in order: the job exists, it was not cancelled,
-- the caller's token is the lease, the job is in one of the allowed states. Answers nil
-- when all pass, else the refusal to return.
local function fence(job, lease, token, allowed)
  local state = redis.call('HGET', job, 'state')
  if not state then
    return missing_or_corrupt(job)
  end
  local bad = corrupt(job)
  if bad then
    return bad
  end
  if state == 'cancelled' then
    return { 'cancelled' }
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
    return missing_or_corrupt(job)
  end
  local bad = corrupt(job)
  if bad then
    return bad
  end
  if (allowed and not allowed[state]) or (not allowed and TERMINAL[state]) then
    return { 'wrong_state', state }
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


-- A background response the current attempt reads: its id, what it was made for, and the
-- last event whose output is in the stored text ('' : none is, the text matches no event
-- of it). A new id also records the attempt that made it, the cursor then, and the
-- stored text's length (bytes) before any of its output: ``text_base``.
local function note_response(job, id, seq, made_for, text_base, spent_base)
  if id == '' then
    return
  end
  if redis.call('HGET', job, 'response_id') ~= id then
    -- What the response made is what the cursor gains from here: its bases are the text
    -- and the cursor as they stand before any of its output (after what this attempt
    -- already counted: another response's output carried before this one was made).
    redis.call('HSET', job, 'response_id', id, 'response_for', made_for,
      'response_attempt', redis.call('HGET', job, 'attempt') or '0',
      'response_spent_base', spent_base,
      'response_text_base', text_base)
  end
  if seq == '' then
    redis.call('HDEL', job, 'response_seq')
  else
    redis.call('HSET', job, 'response_seq', seq)
  end
end
