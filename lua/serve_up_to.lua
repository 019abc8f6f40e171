-- serve_up_to.lua — first come, first served across the buckets of a voucher
-- (design/buckets.md hole 4): the mover's bound on a bucket's own serving.
-- Internal to `seckill worker`'s mover, not for application servers.
--
-- Each round the mover reads the waiting requests of every bucket, gives
-- the voucher's free units to the earliest of them, and publishes here the
-- queued time up to which a bucket serves: in every bucket the first
-- request no unit was left for, or, when units were left over, the last
-- request given units, in the buckets whose requests were given units
-- (and lifts it in the others). While the bound is live, a bucket serves
-- no request queued after it (lua/lib/waitlist.lua: a release, a give, a
-- repair), and a bucket where requests wait admits no newcomer from its
-- stock (lua/seckill.lua answers "sold out" with a place in line): those
-- units are kept for requests that came earlier, here or at another
-- bucket, and the mover moves and serves them. The bound holds for
-- ARGV[3] ms by this master's clock, so a mover that stops holds no
-- bucket's units for longer: the bucket then serves and sells as it
-- would without the bound.
--
-- KEYS[1]  a bucket's meta (seckill:{V.b.s}:meta): fields serve_up_to (a
--          queued time, µs of Redis TIME) and serve_up_to_until (Unix ms);
--          mover_epoch as for a give; begin_ms (loaded); lent and
--          lent_until (ARGV[5])
--
-- ARGV[1]  the mover's epoch (lua/mover_lease.lua)
-- ARGV[2]  the bound: a queued time in microseconds, or '' to lift it
-- ARGV[3]  how long it holds, in ms (1 .. 60000)
-- ARGV[4]  optional: the voucher's free units no waiting request is given
--          (every open bucket's stock and the pool, less what the mover
--          allots; a bucket paused, or on a server not yet checked, is
--          not open): written to meta units_free, live for ARGV[3] ms
--          (units_free_until, Unix ms); lua/seckill.lua lets a request
--          its bucket cannot fill wait for the mover while it is at least
--          the quantity asked, or lapsed. Empty / absent: left as it is.
-- ARGV[5]  optional: the units of this bucket's stock the mover's round
--          takes to earlier requests waiting at other buckets: written to
--          meta lent, live for ARGV[3] ms (lent_until, Unix ms). While
--          live, this bucket serves its line (lua/lib/waitlist.lua) and
--          sells to newcomers (lua/seckill.lua) from its stock less these
--          units, whether or not a bound is set here, so they are still
--          there when the move takes them; lua/transfer_take.lua counts
--          them down as it takes them. '0' clears them; empty / absent:
--          left as they are.
--
-- Returns {code, reason, value}:
--   {0, "set", 0}             the bound is set (or lifted)
--   {3, "fenced", epoch}      the bucket has seen a later mover: nothing written
--   {4, "unchecked", 0}       the bucket is on a server other than the one
--                             its state was last checked on (meta's
--                             run_id: lua/lib/server_checked.lua), not yet
--                             checked by the gate guard: nothing written
--   {5, "not loaded", 0}      meta has no begin_ms: nothing written
--
-- Safe to run twice: it sets the same fields again.

local epoch, up_to, ttl = mover_epoch(ARGV[1]), ARGV[2], tonumber(ARGV[3])
if not epoch then
  return redis.error_reply('ERR serve_up_to: the epoch must be 1 or more')
end
if up_to ~= '' and not (type(up_to) == 'string' and string.match(up_to, '^[1-9][0-9]*$') and #up_to <= 16) then
  return redis.error_reply('ERR serve_up_to: the bound must be a time in microseconds, or empty')
end
if not ttl or ttl < 1 or ttl > 60000 or ttl ~= math.floor(ttl) then
  return redis.error_reply('ERR serve_up_to: the time it holds must be 1 to 60000 ms')
end

local free = ARGV[4]
if free ~= nil and free ~= '' and not (string.match(free, '^[0-9]+$') and #free <= 16) then
  return redis.error_reply('ERR serve_up_to: the free units must be a count, or empty')
end

local lent = ARGV[5]
if lent ~= nil and lent ~= '' and not (string.match(lent, '^[0-9]+$') and #lent <= 16) then
  return redis.error_reply('ERR serve_up_to: the lent units must be a count, or empty')
end

local meta = redis.call('HMGET', KEYS[1], 'mover_epoch', 'begin_ms')
local seen = epoch_seen(meta[1])
local refused = fenced(epoch, seen)
if refused then return refused end
if not meta[2] then return {5, 'not loaded', 0} end
if not server_checked(KEYS[1]) then return {4, 'unchecked', 0} end
see_epoch(KEYS[1], epoch, seen)

local now = redis.call('TIME')
local until_ms = string.format('%d', tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000) + ttl)
if up_to == '' then
  redis.call('HDEL', KEYS[1], 'serve_up_to', 'serve_up_to_until')
else
  redis.call('HSET', KEYS[1], 'serve_up_to', up_to, 'serve_up_to_until', until_ms)
end
if free ~= nil and free ~= '' then
  redis.call('HSET', KEYS[1], 'units_free', free, 'units_free_until', until_ms)
end
if lent ~= nil and lent ~= '' then
  if tonumber(lent) == 0 then
    redis.call('HDEL', KEYS[1], 'lent', 'lent_until')
  else
    redis.call('HSET', KEYS[1], 'lent', lent, 'lent_until', until_ms)
  end
end
return {0, 'set', 0}
