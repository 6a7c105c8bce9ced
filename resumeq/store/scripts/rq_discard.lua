-- rq_discard: delete an attempt's RQ job that waits, queued on its queue or scheduled (in
-- resumeq's due-time index or RQ's scheduled registry), as RQ's Job.delete does for one
-- that never ran: off its queue and the registries, its hash and the keys RQ keeps beside
-- it deleted. One with an execution record, or in another status, is left to RQ.
-- KEYS[1] the RQ job hash   KEYS[2] its queue's list   KEYS[3] the due-time index
-- KEYS[4] RQ's scheduled registry of its queue   KEYS[5] its dependents set
-- KEYS[6] its dependencies set   KEYS[7] its results stream   KEYS[8] its executions
-- ARGV[1] RQ job id   ARGV[2] the queue the keys are of (the job's origin, read before)
-- Answers: 1 deleted | 0 none, or started | -1 another status, another queue or an
-- execution record: RQ's own delete decides
local job, list, due_index, scheduled = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local rq_id, origin = ARGV[1], ARGV[2]

redis.call('ZREM', due_index, rq_id)
local fields = redis.call('HMGET', job, 'status', 'origin')
local status = fields[1]
if not status or status == 'started' then
  return 0
end
if (status ~= 'queued' and status ~= 'scheduled') or fields[2] ~= origin
    or redis.call('EXISTS', KEYS[8]) == 1 then
  return -1
end
redis.call('LREM', list, 0, rq_id)
redis.call('ZREM', scheduled, rq_id)
redis.call('DEL', job, KEYS[5], KEYS[6], KEYS[7])
return 1
