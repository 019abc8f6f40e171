-- reconcile.lua — apply a reconciliation repair to one voucher's gate, only
-- if nothing moved since the repair was computed.
--
-- `seckill reconcile` reads Redis, then MySQL, computes the repair, and calls
-- this script with the witness it read. Any admission, release, promotion
-- or other repair in between changes the witness; the script then writes
-- nothing and returns 0, and reconcile reads again. So a repair computed
-- from a moving sale is never applied (it could re-admit a sold unit).
--
-- KEYS[1]  seckill:{V}:stock      KEYS[4]  seckill:{V}:released
-- KEYS[2]  seckill:{V}:buyers     KEYS[5]  seckill:{V}:timeouts
-- KEYS[3]  seckill:{V}:orders
--
-- ARGV[1..4]  the gate's witness (the same four values lua/preload.lua
--             checks, src/gate/witness.rs): last order-stream entry id ('' if
--             none), gate stock ('' if none), buyers count, released count
-- ARGV[5]     stock delta (+ gives units back, - takes them away)
-- ARGV[6]     A, then A user ids to add to the buyers
-- then        R, then R user ids to remove from the buyers
-- then        D, then D pairs: order id, payment deadline ms
--
-- Returns 1 when applied, 0 when the voucher moved (nothing written).
--
-- Safe to run twice: a repair that moves the stock or a set's size changes
-- the witness, so its replay writes nothing and returns 0 (reconcile reads
-- again and finds nothing left to repair, so it reports the voucher
-- consistent, not repaired); one that moves neither (as many buyers added
-- as removed, deadlines) replays set operations that are done.

local last = redis.call('XREVRANGE', KEYS[3], '+', '-', 'COUNT', 1)
local last_id = ''
if last[1] then last_id = last[1][1] end
if last_id ~= ARGV[1]
  or (redis.call('GET', KEYS[1]) or '') ~= ARGV[2]
  or tostring(redis.call('SCARD', KEYS[2])) ~= ARGV[3]
  or tostring(redis.call('SCARD', KEYS[4])) ~= ARGV[4] then
  return 0
end

local delta = tonumber(ARGV[5])
if delta ~= 0 then redis.call('INCRBY', KEYS[1], delta) end
local i = 6
local adds = tonumber(ARGV[i]); i = i + 1
for _ = 1, adds do redis.call('SADD', KEYS[2], ARGV[i]); i = i + 1 end
local removes = tonumber(ARGV[i]); i = i + 1
for _ = 1, removes do redis.call('SREM', KEYS[2], ARGV[i]); i = i + 1 end
local deadlines = tonumber(ARGV[i]); i = i + 1
for _ = 1, deadlines do
  redis.call('ZADD', KEYS[5], ARGV[i + 1], ARGV[i])
  i = i + 2
end
return 1
