-- run_id.lua — the run id of the Redis server that holds KEYS[1] (on a
-- cluster, the master of its slot). It changes when that server restarts or
-- another takes over (a failover): the moments Redis can come back without
-- writes it had acknowledged. Used by the worker's gate guard.
--
-- KEYS[1]  seckill:{V}:meta
-- ARGV[1]  optional: a run id the guard has dealt with, recorded in meta's
--          `run_id` field if the gate is loaded (never creating meta: a
--          lost gate must not look loaded). A guard started later, or
--          meta restored from an older snapshot, compares with it.
-- Returns the 40-hex run id of this server.
--
-- Safe to run twice: recording the same id again changes nothing.

if ARGV[1] and ARGV[1] ~= '' and redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('HSET', KEYS[1], 'run_id', ARGV[1])
end
return string.match(redis.call('INFO', 'server'), 'run_id:(%x+)')
