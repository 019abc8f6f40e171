-- run_id.lua — the run id of the Redis server that holds KEYS[1] (on a
-- cluster, the master of its slot). It changes when that server restarts or
-- another takes over (a failover): the moments Redis can come back without
-- writes it had acknowledged. Used by the worker's gate guard.
--
-- KEYS[1]  any key of the voucher (seckill:{V}:meta)
-- Returns the 40-hex run id.

return string.match(redis.call('INFO', 'server'), 'run_id:(%x+)')
