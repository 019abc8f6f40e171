-- release.lua — layer 5: give back the units of cancelled orders, each once.
--
-- Called by `seckill worker` after MySQL committed the cancellations (and by
-- reconciliation for cancellations whose unit never came back). Idempotent
-- by order id: the `released` set remembers every order already handled, so
-- a redelivered deadline or a second caller changes nothing.
--
-- For each cancelled order, the unit goes to the oldest waitlisted user who
-- is not a buyer yet: that user becomes a buyer, a `promote` order (with the
-- new order id given here) enters the order stream for the worker to persist,
-- and a `promoted` event is appended for the application to notify them.
-- Waitlisted users who already hold a unit are dropped from the waitlist.
-- With nobody waiting, the unit goes back to the gate's stock.
--
-- KEYS[1]  seckill:{V}:stock      KEYS[5]  seckill:{V}:events
-- KEYS[2]  seckill:{V}:buyers     KEYS[6]  seckill:{V}:timeouts
-- KEYS[3]  seckill:{V}:waitlist   KEYS[7]  seckill:{V}:released
-- KEYS[4]  seckill:{V}:orders     KEYS[8]  seckill:{V}:meta
--                                 KEYS[9]  seckill:{V}:holds  (optional: while a
--                                          worker holds the gate, a repair's
--                                          release is deferred too)
--
-- ARGV[1]  voucher id
-- ARGV[2]  while the gate is paused (meta paused = 1, lua/pause.lua): '' to
--          defer (the payment deadlines: a paused gate's buyers set may miss
--          users with an order, who must not be promoted, and its stock is
--          being rebuilt), or the pause_token of the view the caller has just
--          repaired the gate on (reconcile): then it goes on if no pause came
--          since. **Changed in this release**: the count N was ARGV[2].
-- ARGV[3]  N, then N pairs: cancelled order id, a fresh order id for a promotion
-- then     order ids whose deadline is simply dropped (paid, or unknown to MySQL)
--
-- Returns {released, promoted, deferred}: units handled now (not before),
-- how many of them went to waitlisted users, and 1 when nothing was done
-- because the gate is paused (the caller's claimed deadlines come back
-- after their lease). meta's `promotions` counts promotions ever.
--
-- Safe to run twice: every order of the first run is in `released`, so the
-- replay gives no unit back, promotes nobody and appends nothing (returns
-- {0, 0, 0}); its ZREMs remove what is already gone.
--
-- The `promoted` event (KEYS[5]), an application contract; every field but
-- `type` is a decimal string:
--   type            "promoted"
--   user            the waitlisted user who now holds a unit
--   order           the new order id (pending payment once the worker
--                   persists it; its deadline runs from the promote entry)
--   voucher         the voucher id
--   released_order  the cancelled order whose unit was handed over
--   time_ms         Redis server time of the promotion (Unix ms)

-- `hold_is_live` comes from lua/lib/holds.lua, which the binary prepends.
local voucher = ARGV[1]
local n = tonumber(ARGV[3])
if not n then return redis.error_reply('ERR release.lua: ARGV[3] must be the count of cancelled orders') end
local state = redis.call('HMGET', KEYS[8], 'paused', 'pause_token')
if state[1] == '1' and (ARGV[2] == '' or ARGV[2] ~= (state[2] or '') or hold_is_live(KEYS[9])) then
  return {0, 0, 1}
end
local released, promoted = 0, 0
local t = redis.call('TIME')
local now_ms = tostring(tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))

local function next_waiting()
  while true do
    local head = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
    if not head then return nil end
    redis.call('ZREM', KEYS[3], head)
    if redis.call('SISMEMBER', KEYS[2], head) == 0 then return head end
  end
end

for i = 0, n - 1 do
  local order, fresh = ARGV[4 + 2 * i], ARGV[5 + 2 * i]
  redis.call('ZREM', KEYS[6], order)
  if redis.call('SADD', KEYS[7], order) == 1 then
    released = released + 1
    local user = next_waiting()
    if user then
      redis.call('SADD', KEYS[2], user)
      redis.call('XADD', KEYS[4], '*', 'user', user, 'order', fresh, 'voucher', voucher, 'kind', 'promote')
      redis.call('XADD', KEYS[5], '*', 'type', 'promoted', 'user', user, 'order', fresh,
        'voucher', voucher, 'released_order', order, 'time_ms', now_ms)
      redis.call('HINCRBY', KEYS[8], 'promotions', 1)
      promoted = promoted + 1
    else
      redis.call('INCR', KEYS[1])
    end
  end
end
for i = 4 + 2 * n, #ARGV do
  redis.call('ZREM', KEYS[6], ARGV[i])
end
return {released, promoted, 0}
