-- reconcile.lua — apply a reconciliation repair to one voucher's gate, only
-- if nothing moved since the repair was computed.
--
-- `seckill reconcile` reads Redis, then MySQL, computes the repair, and calls
-- this script with the witness it read. Any admission, release, promotion
-- or other repair in between changes the witness; the script then writes
-- nothing and returns 0, and reconcile reads again. So a repair computed
-- from a moving sale is never applied (it could re-admit a sold unit).
--
-- KEYS[1]  seckill:{V}:stock      KEYS[5]  seckill:{V}:timeouts
-- KEYS[2]  seckill:{V}:buyers     KEYS[6]  seckill:{V}:waitlist  (optional, with 7, 8)
-- KEYS[3]  seckill:{V}:orders     KEYS[7]  seckill:{V}:events
-- KEYS[4]  seckill:{V}:released   KEYS[8]  seckill:{V}:meta
--                                 KEYS[9]  seckill:{V}:holds     (optional)
--                                 KEYS[10] seckill:{V}:waitlist_quantity (optional,
--                                          with KEYS[9])
--
-- `serve_waitlist` comes from lua/lib/waitlist.lua, which the binary
-- prepends with lua/lib/holds.lua.
--
-- While a worker holds the gate (KEYS[9], lua/lib/holds.lua, which the
-- binary prepends) no unit is given back: the view this repair was computed
-- on misses that worker's batch. Nor while a pause's grace runs (meta
-- reopen_after_ms, with KEYS[9]): such a worker holds the gate at its next
-- keep-alive tick, within the grace, and a unit given before then may be
-- its batch's. The rest is applied (stock lowered, buyers, deadlines,
-- spoken-for cancellations) and the reply is 2.
--
-- ARGV[1..4]  the gate's witness (the same four values lua/preload.lua
--             checks, src/gate/witness.rs): last order-stream entry id ('' if
--             none), gate stock ('' if none), buyers count, released count
-- ARGV[5]     stock delta (+ gives units back, - takes them away)
-- ARGV[6]     A, then A user ids to add to the buyers (each also taken off
--             KEYS[6] and KEYS[10] when given: a buyer waits no more)
-- then        R, then R user ids to remove from the buyers
-- then        D, then D pairs: order id, payment deadline ms
-- then        P, then P fresh order ids (optional, with KEYS[6..8]): units
--             given back and the gate's stock serve waiting requests first,
--             in order, each whole or passed over (KEYS[10] their units),
--             as lua/release.lua serves released units (a `promote` entry,
--             a `promoted` event whose released_order is "0", meta's
--             promotions counted); only the rest goes to stock
-- then        M, then M cancelled order ids (optional) to mark released
--             without giving a unit back: the gate owes more units than
--             MySQL has (a release whose promoted order MySQL holds, its
--             record lost), so their units are spoken for already
--
-- Returns 1 when applied, 0 when the voucher moved (nothing written), 2 when
-- applied but for the units to give back (a worker holds the gate, or a
-- pause's grace runs).
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
local withheld = delta > 0 and (hold_is_live(KEYS[9]) or (KEYS[9] and grace_runs(KEYS[8])))
if withheld then delta = 0 end
local i = 6
-- The digests (lua/lib/digest.lua) follow every member added or removed;
-- a caller without KEYS[8] leaves them behind (reconcile --deep finds that).
local meta = KEYS[8]
local function counted(field, members, sign)
  if meta then digest_move(meta, field, members, sign) end
end
local adds = tonumber(ARGV[i]); i = i + 1
local changed = {}
for _ = 1, adds do
  if redis.call('SADD', KEYS[2], ARGV[i]) == 1 then changed[#changed + 1] = ARGV[i] end
  -- A buyer waits no more: a promotion Redis lost (back to older data)
  -- leaves its user waiting, where only a promotion reaching them would
  -- take them off.
  if KEYS[6] then redis.call('ZREM', KEYS[6], ARGV[i]) end
  if KEYS[10] then redis.call('HDEL', KEYS[10], ARGV[i], 'ref:' .. ARGV[i]) end
  i = i + 1
end
counted('buyers_digest', changed, 1)
local removes = tonumber(ARGV[i]); i = i + 1
changed = {}
for _ = 1, removes do
  if redis.call('SREM', KEYS[2], ARGV[i]) == 1 then changed[#changed + 1] = ARGV[i] end
  i = i + 1
end
counted('buyers_digest', changed, -1)
local deadlines = tonumber(ARGV[i]); i = i + 1
local scheduled = {}
for _ = 1, deadlines do
  scheduled[#scheduled + 1] = {ARGV[i], ARGV[i + 1]}
  i = i + 2
end
if meta then
  zadd_counted(KEYS[5], meta, 'timeouts_digest', scheduled)
else
  for _, p in ipairs(scheduled) do redis.call('ZADD', KEYS[5], p[2], p[1]) end
end
local fresh = tonumber(ARGV[i] or '0'); i = i + 1
local first_fresh = i
i = i + fresh
-- Units given back: the waitlist first (after the buyers were repaired
-- above, so nobody holding an order is promoted), then the stock.
if delta > 0 and fresh > 0 and KEYS[8] then
  local t = redis.call('TIME')
  local now_ms = tostring(tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
  local voucher = string.match(KEYS[1], '{(%d+)}')
  local pool = delta + math.max(tonumber(redis.call('GET', KEYS[1]) or '0') or 0, 0)
  local ids = {}
  for n = 0, fresh - 1 do ids[#ids + 1] = ARGV[first_fresh + n] end
  local k = {waitlist = KEYS[6], buyers = KEYS[2], orders = KEYS[3], events = KEYS[7],
    meta = KEYS[8], wants = KEYS[10]}
  local _, promoted = serve_waitlist(k, voucher, pool, ids, function() return '0' end, now_ms)
  delta = delta - promoted
end
if delta ~= 0 then redis.call('INCRBY', KEYS[1], delta) end
local spoken = tonumber(ARGV[i] or '0'); i = i + 1
changed = {}
for _ = 1, spoken do
  if redis.call('SADD', KEYS[4], ARGV[i]) == 1 then changed[#changed + 1] = ARGV[i] end
  i = i + 1
end
counted('released_digest', changed, 1)
return withheld and 2 or 1
