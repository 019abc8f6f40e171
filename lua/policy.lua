-- policy.lua — publish a voucher's admission policy at its gate (`seckill
-- voucher update`, and reconcile's repair of a gate whose policy differs
-- from MySQL). lua/seckill.lua reads it on every attempt, so it takes
-- effect at once, during a sale.
--
-- KEYS[1]  seckill:{V}:meta   hash   fields user_rate, require_token
-- ARGV[1]  user_rate: at most this many attempts per user in any one second
--          (0: no limit)
-- ARGV[2]  require_token: 1 when admission needs a token, else 0
--
-- Returns 1 when published, 0 when the voucher is not loaded at the gate
-- (nothing written: `seckill preload` publishes the policy with the gate).
--
-- Safe to run twice: the replay writes the same two fields again.

if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], 'user_rate', ARGV[1], 'require_token', ARGV[2])
return 1
