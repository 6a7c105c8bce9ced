-- due_promote: move the attempts whose due time has come (this clock) from resumeq's
-- due-time index onto the front of their queues' lists (the spill lane's back: it stays
-- first in, first out), each as RQ would enqueue it (status queued, enqueued now), at
-- most ARGV[4] of them, earliest due first in line.
-- An entry whose RQ job is gone, or no longer scheduled, is dropped. RQ's keys carry no
-- hash tag (RQ runs on one Redis, never a cluster), so they are built here from RQ's
-- prefixes: the move and the index must change in one step, or a job is moved twice.
-- KEYS[1] the due-time index
-- ARGV[1] RQ's job key prefix   ARGV[2] RQ's queue key prefix   ARGV[3] enqueued_at
-- ARGV[4] the most to move   ARGV[5] the spill lane's name
-- Answers { moved, the next due time ('' if none), now } (ms).
local due_index = KEYS[1]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ids = redis.call('ZRANGEBYSCORE', due_index, '-inf', now, 'LIMIT', 0, tonumber(ARGV[4]))
local moved = 0
local function move(id, front)
  local job = ARGV[1] .. id
  local fields = redis.call('HMGET', job, 'status', 'origin')
  if fields[1] == 'scheduled' and fields[2] and (fields[2] == ARGV[5]) ~= front then
    redis.call('HSET', job, 'status', 'queued', 'enqueued_at', ARGV[3])
    redis.call(front and 'LPUSH' or 'RPUSH', ARGV[2] .. fields[2], id)
    moved = moved + 1
  end
end
for i = #ids, 1, -1 do  -- pushed at the front: the latest first, so the earliest leads
  move(ids[i], true)
end
for i = 1, #ids do  -- the spill lane's, at the back in due order
  move(ids[i], false)
  redis.call('ZREM', due_index, ids[i])
end
local head = redis.call('ZRANGE', due_index, 0, 0, 'WITHSCORES')
return { moved, head[2] or '', now }
