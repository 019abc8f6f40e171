-- raise_commits.lua — set a gate's witness of MySQL's commits (meta
-- `committed`) back up to what MySQL holds, never past it.
--
-- The witness counts the orders workers inserted into MySQL (lua/finish.lua
-- adds one per acknowledgement). Redis restarted from an older snapshot or
-- failed over to a lagging replica takes the increments since then with it,
-- while MySQL keeps those orders: the witness is then short for good, and a
-- later MySQL failover that loses at most that many commits is unseen by
-- the gate guard (the canceller would drop the lost orders' deadlines).
-- Reconcile calls this after it read MySQL, so the witness follows MySQL
-- up again.
--
-- It must never count an order twice: an order already in MySQL whose
-- stream entry is still pending (a batch committed, its finish.lua not yet
-- run) or not yet delivered (Redis went back to before its delivery; a
-- worker that committed it before the loss may still acknowledge it) would
-- add one again when acknowledged. Those entries are counted here, in the
-- same step as the write, and left out: the witness set errs low, never
-- high. It is only raised, never lowered (a MySQL that lost commits is
-- found by the witness being above MySQL's count; lowering is
-- lua/forget_commits.lua's job).
--
-- A count read before MySQL lost commits is still a count of orders the
-- witness may hold: a loss after it is found by the witness being above
-- MySQL's new count. Except once lua/forget_commits.lua took such a loss
-- off the witness (the operator dropped commits nothing kept names): a
-- count read before that would put the gap back, and the guard would
-- pause for it again. So the caller passes meta's `forgotten` (bumped by
-- each forget) as it read it before MySQL, and nothing is written if it
-- moved since.
--
-- KEYS[1]  seckill:{V}:orders   stream
-- KEYS[2]  seckill:{V}:meta     hash   its `committed` and `forgotten`
-- ARGV[1]  the workers' consumer group
-- ARGV[2]  MySQL's orders of this gate, counted before this call
-- ARGV[3]  meta's `forgotten` as read before MySQL (0 when absent)
--
-- Returns the witness after; -1 when the gate has no meta (gone whole:
-- nothing is written, a meta of one field would read as a gate); -2 when
-- a forget came after the caller's read (nothing written: read again).
--
-- Safe to run twice and at any time: each run writes at most what MySQL
-- held when it was read, less what is in flight.

local held = tonumber(ARGV[2])
if not held or held < 0 or held % 1 ~= 0 then
  return redis.error_reply('ERR raise_commits.lua: ARGV[2] must be a count of orders')
end
local forgotten = tonumber(ARGV[3])
if not forgotten then
  return redis.error_reply('ERR raise_commits.lua: ARGV[3] must be the forget count read')
end
if redis.call('EXISTS', KEYS[2]) == 0 then return -1 end
if (tonumber(redis.call('HGET', KEYS[2], 'forgotten') or '0') or 0) ~= forgotten then
  return -2
end

local in_flight = 0
if redis.call('EXISTS', KEYS[1]) == 1 then
  local length = redis.call('XLEN', KEYS[1])
  -- No group yet: every entry may still be delivered.
  in_flight = length
  for _, g in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
    local f = {}
    for i = 1, #g, 2 do f[g[i]] = g[i + 1] end
    if f['name'] == ARGV[1] then
      -- Redis's lag is unknown (nil) after some deletions, and may stay
      -- above the truth after trims: the stream's length bounds it then.
      local lag = tonumber(f['lag']) or length
      if lag < 0 then lag = length end
      in_flight = tonumber(f['pending']) + lag
    end
  end
end

local floor = held - in_flight
local now = tonumber(redis.call('HGET', KEYS[2], 'committed') or '0') or 0
-- Never a witness below 0 (an old one may be: see forget_commits.lua).
if floor > now and floor > 0 then
  redis.call('HSET', KEYS[2], 'committed', floor)
  return floor
end
return now
