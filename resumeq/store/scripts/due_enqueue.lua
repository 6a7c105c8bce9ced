-- due_enqueue: write an attempt's RQ job once (RQ's unique enqueue: refused when the job
-- exists), then put it on its queue's list if it is due, else into resumeq's due-time
-- index (scored by its due time, this clock), waking one scheduler to look again. Given
-- the job's outbox, it also marks done the entry that asked for the attempt, if it is
-- still the one given (a newer commit may have replaced it meanwhile), whether the RQ job
-- was written now or before: carried out either way (as outbox_done does).
-- KEYS[1] the RQ job hash   KEYS[2] the queue's list   KEYS[3] the due-time index
-- KEYS[4] RQ's set of queues   KEYS[5] the schedulers' wake-up list
-- KEYS[6] the job's outbox hash (optional)   KEYS[7] the outbox zset (with KEYS[6])
-- ARGV[1] RQ job id   ARGV[2] TTL (s; -1: none)   ARGV[3] due (ms; 0: now)
-- ARGV[4] 'L' (the front of the queue) or 'R' (the back)   ARGV[5] the queue's key
-- ARGV[6] the job id   ARGV[7] the outbox entry carried out ('' without KEYS[6])
-- ARGV[8..] the job hash's fields and values, as RQ writes them (status queued)
-- Answers 1 when written, 0 when that RQ job exists already.
local unpack = unpack or table.unpack
local job, list, due_index, queues, wake = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local outbox, pending = KEYS[6], KEYS[7]

local function write()
  if redis.call('EXISTS', job) == 1 then
    return 0
  end
  redis.call('HSET', job, unpack(ARGV, 8))
  local ttl = tonumber(ARGV[2])
  if ttl and ttl > 0 then
    redis.call('EXPIRE', job, ttl)
  end
  redis.call('SADD', queues, ARGV[5])
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local due = tonumber(ARGV[3]) or 0
  if due <= now then
    if ARGV[4] == 'L' then
      redis.call('LPUSH', list, ARGV[1])
    else
      redis.call('RPUSH', list, ARGV[1])
    end
    return 1
  end
  redis.call('HSET', job, 'status', 'scheduled')
  redis.call('HDEL', job, 'enqueued_at')
  redis.call('ZADD', due_index, string.format('%d', due), ARGV[1])
  redis.call('LPUSH', wake, '1')
  redis.call('LTRIM', wake, 0, 0)
  redis.call('PEXPIRE', wake, 60000)
  return 1
end

local written = write()
if outbox then
  if redis.call('HGET', outbox, 'attempt') == ARGV[7] then
    redis.call('HDEL', outbox, 'attempt')
  end
  if redis.call('HLEN', outbox) == 0 then
    redis.call('ZREM', pending, ARGV[6])
  end
end
return written
