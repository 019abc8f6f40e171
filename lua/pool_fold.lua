-- pool_fold.lua — the pool of a voucher split into buckets, folded into
-- bucket 0's stock while the gate guard rebuilds bucket 0 (worker/guard.rs,
-- design/buckets.md). Internal to `seckill worker`.
--
-- The pool lives on bucket 0's tag, so a loss of writes on bucket 0's
-- master is a loss of the pool's too (a take from the pool forgotten while
-- its units landed elsewhere leaves the pool high). Folded into the paused
-- bucket's stock, its units are counted by the rebuild with the bucket's
-- own, which it sets from MySQL and the other buckets.
--
-- KEYS[1]  seckill:{V}:meta   (must be paused)
-- KEYS[2]  seckill:{V}:pool
-- KEYS[3]  seckill:{V}:stock
-- ARGV[1]  the pool's units as the caller read them
--
-- Returns 1 when folded, 0 when the pool is no longer ARGV[1] (nothing
-- written), -1 when the gate is not paused (nothing written).
-- Safe to run twice: the pool is 0 after the first, so the second finds it
-- is not what was read and writes nothing.

if redis.call('HGET', KEYS[1], 'paused') ~= '1' then return -1 end
local pool = redis.call('GET', KEYS[2]) or '0'
if pool ~= ARGV[1] then return 0 end
local units = tonumber(pool)
if not units or units <= 0 then return 0 end
redis.call('INCRBY', KEYS[3], units)
redis.call('SET', KEYS[2], 0)
return 1
