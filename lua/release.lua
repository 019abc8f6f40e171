-- release.lua — layer 5: give back the units of cancelled orders, each once.
--
-- Called by `seckill worker` after MySQL committed the cancellations (and by
-- reconciliation for cancellations whose unit never came back). Idempotent
-- by order id: the `released` set remembers every order already handled, so
-- a redelivered deadline or a second caller changes nothing.
--
-- The units of the orders released now (each order's quantity) and the
-- gate's free stock are one pool, which serves the waitlist in order of
-- arrival, each request whole (its units, from KEYS[10]; 1 when absent) or
-- not at all: a request the pool cannot serve is passed over and keeps its
-- place, and the next one that fits is served (a later, smaller request
-- can so be served before an earlier, larger one). A served user becomes a
-- buyer, a `promote` order (with one of the fresh order ids given here)
-- enters the order stream for the worker to persist, and a `promoted` event
-- is appended for the application to notify them. Waitlisted users who
-- already hold an order are dropped from the waitlist. What no waiting
-- request fits stays in the gate's stock, so after a release no waiting
-- request among those looked at fits the stock: at most 1,000 waiting
-- requests per call (one further back is served by a later release), and
-- promotions stop when the fresh ids given run out. A bucket of a voucher
-- in buckets serves no request queued after the mover's live bound
-- (lua/serve_up_to.lua): the units wait in its stock for the mover, which
-- moves them to an earlier request elsewhere.
--
-- KEYS[1]  seckill:{V}:stock      KEYS[5]  seckill:{V}:events
-- KEYS[2]  seckill:{V}:buyers     KEYS[6]  seckill:{V}:timeouts
-- KEYS[3]  seckill:{V}:waitlist   KEYS[7]  seckill:{V}:released
-- KEYS[4]  seckill:{V}:orders     KEYS[8]  seckill:{V}:meta
--                                 KEYS[9]  seckill:{V}:holds  (optional: while a
--                                          worker holds the gate, or a
--                                          pause's grace runs, a repair's
--                                          release is deferred too)
--                                 KEYS[10] seckill:{V}:waitlist_quantity (optional,
--                                          with KEYS[9]): the units waiting
--                                          requests want (absent: 1) and
--                                          their client references
--                                          (ref:<user>), which a
--                                          promotion's entry carries
--
-- ARGV[1]  voucher id
-- ARGV[2]  while the gate is paused (meta paused = 1, lua/pause.lua): '' to
--          defer (the payment deadlines: a paused gate's buyers set may miss
--          users with an order, who must not be promoted, and its stock is
--          being rebuilt), or the pause_token of the view the caller has just
--          repaired the gate on (reconcile): then it goes on if no pause came
--          since.
-- ARGV[3]  N, then N triples: cancelled order id, the units it holds (its
--          quantity), a fresh order id for a promotion
-- then     F, then F more fresh order ids: promotions may be more than the
--          orders released (one order of 3 units serves three requests of
--          1); pass the units released less N plus the voucher's per-user
--          limit, enough for any release
-- then     order ids whose deadline is simply dropped (paid, or unknown to MySQL)
--
-- Returns {released, promoted, deferred}: units given back now (orders
-- released before count nothing), how many of them went to waitlisted
-- users, and 1 when nothing was done because the gate is paused (the
-- caller's claimed deadlines come back after their lease). meta's
-- `promotions` counts promotions (orders) ever.
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
--   released_order  a cancelled order released in the same call (its units
--                   joined the pool the promotion was served from)
--   quantity        the units the promoted order holds
--   time_ms         Redis server time of the promotion (Unix ms)
--   waited_ms       how long the request waited, from its first queueing
--                   (the waitlist's score, this master's clock)

-- `hold_is_live` and `grace_runs` come from lua/lib/holds.lua, `serve_waitlist` from
-- lua/lib/waitlist.lua; the binary prepends both.
local voucher = ARGV[1]
local n = tonumber(ARGV[3])
if not n then return redis.error_reply('ERR release.lua: ARGV[3] must be the count of cancelled orders') end
local extra = tonumber(ARGV[4 + 3 * n])
if not extra then return redis.error_reply('ERR release.lua: the count of extra fresh ids must follow the N triples') end
local state = redis.call('HMGET', KEYS[8], 'paused', 'pause_token')
if state[1] == '1' and (ARGV[2] == '' or ARGV[2] ~= (state[2] or '')
    or hold_is_live(KEYS[9]) or (KEYS[9] and grace_runs(KEYS[8]))) then
  return {0, 0, 1}
end
local t = redis.call('TIME')
local now_ms = tostring(tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))

-- The units coming back now, each order once; their fresh ids, then the extras.
local pool, released, fresh, released_from = 0, 0, {}, {}
local timeouts_gone, released_now = {}, {}
for i = 0, n - 1 do
  local order, units, id = ARGV[4 + 3 * i], tonumber(ARGV[5 + 3 * i]), ARGV[6 + 3 * i]
  if not units or units < 1 then
    return redis.error_reply('ERR release.lua: the units of order ' .. tostring(order) .. ' must be 1 or more')
  end
  if redis.call('ZREM', KEYS[6], order) == 1 then timeouts_gone[#timeouts_gone + 1] = order end
  if redis.call('SADD', KEYS[7], order) == 1 then
    released_now[#released_now + 1] = order
    pool = pool + units
    released = released + units
    fresh[#fresh + 1] = id
    released_from[#released_from + 1] = order
  end
end
for i = 1, extra do fresh[#fresh + 1] = ARGV[4 + 3 * n + i] end

local promoted = 0
if pool > 0 then
  -- The gate's free units join: a waiting request must never fit them.
  pool = pool + math.max(tonumber(redis.call('GET', KEYS[1]) or '0') or 0, 0)
  local k = {waitlist = KEYS[3], buyers = KEYS[2], orders = KEYS[4], events = KEYS[5],
    meta = KEYS[8], wants = KEYS[10]}
  local function released_of(n) return released_from[math.min(n, #released_from)] end
  pool, promoted = serve_waitlist(k, voucher, pool, fresh, released_of, now_ms)
  redis.call('SET', KEYS[1], pool)
end
for i = 4 + 3 * n + extra + 1, #ARGV do
  if redis.call('ZREM', KEYS[6], ARGV[i]) == 1 then timeouts_gone[#timeouts_gone + 1] = ARGV[i] end
end
digest_move(KEYS[8], 'timeouts_digest', timeouts_gone, -1)
digest_move(KEYS[8], 'released_digest', released_now, 1)
return {released, promoted, 0}
