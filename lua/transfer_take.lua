-- transfer_take.lua — moving stock between the gates of a voucher split into
-- buckets (design/buckets.md), step 1 of 3: take units from the giver (the
-- pool or a bucket) into a transfer record. Internal to `seckill worker`'s
-- mover and to reconcile, not for application servers.
--
-- A unit is in exactly one place at every instant: a gate's free stock, or
-- a giver's open transfer record (in transit), until lua/transfer_give.lua
-- lands it in the receiver's stock (or waitlist); lua/transfer_settle.lua
-- then drops the record. A unit in transit is in no stock, so it is never
-- sellable twice; a mover that dies between the steps leaves the record,
-- and whoever completes it asks the receiver first (lua/transfer_void.lua).
--
-- KEYS[1]  the giver's meta: seckill:{V.b.s}:meta (the pool's: bucket 0's,
--          seckill:{V}:meta); fields read: paused, mover_epoch, begin_ms, run_id;
--          a bucket's lent (lua/serve_up_to.lua) counted down by the units
--          taken
-- KEYS[2]  the giver's units: seckill:{V.b.s}:stock, or the pool
--          seckill:{V}:pool
-- KEYS[3]  the giver's open transfers: seckill:{V.b.s}:transfers, or
--          seckill:{V}:pool_transfers; hash id -> "<to> <units> <time_ms>",
--          and field `last`, the highest id ever taken
--
-- ARGV[1]  transfer id: decimal 1 .. 9223372036854775807, a snowflake id
--          (unique; later transfers have higher ids)
-- ARGV[2]  receiver: a bucket number, or "pool"
-- ARGV[3]  units wanted, 1 or more
-- ARGV[4]  the fewest units worth moving, 1 .. ARGV[3] (a waiting request
--          of k units needs k in one transfer)
-- ARGV[5]  the mover's epoch, 1 or more (its lease's): a mover of a lower
--          epoch than the giver has seen is refused, which fences a mover
--          that lost its lease
--
-- Returns {code, reason, value}:
--   {0, "taken", units}   the units now in transit (between ARGV[4] and
--                         ARGV[3]); a replay of this id answers the same
--   {1, "short", stock}   fewer than ARGV[4] units: nothing written
--   {2, "paused", 0}      the giver's gate is paused (being rebuilt), or
--                         on a server other than the one its state was
--                         last checked on (meta's run_id:
--                         lua/lib/server_checked.lua), which the gate
--                         guard has not checked yet: nothing written
--   {3, "fenced", epoch}  the giver has seen a later mover: nothing written
--                         (lua/lib/mover_epoch.lua, the same code in the
--                         give and the serve bound)
--   {4, "stale id", last} the id is not above the highest taken and has no
--                         open record: taken and settled already, or made
--                         by a clock behind the last mover's; nothing written
--   {5, "not loaded", 0}  the giver's gate is not loaded (meta has no
--                         begin_ms: not preloaded yet, or lost): nothing written
--
-- Safe to run twice: the open record answers a replay; after it is settled,
-- `last` refuses the id.

local t, to, want, least, epoch = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]), mover_epoch(ARGV[5])
if not valid_id(t) then return redis.error_reply('ERR transfer_take: bad transfer id') end
if to ~= 'pool' and not string.match(to or '', '^[0-9]+$') then
  return redis.error_reply('ERR transfer_take: the receiver must be a bucket number or "pool"')
end
if not want or want < 1 or want ~= math.floor(want) then
  return redis.error_reply('ERR transfer_take: units wanted must be 1 or more')
end
if not least or least < 1 or least > want or least ~= math.floor(least) then
  return redis.error_reply('ERR transfer_take: the fewest units must be 1 .. the units wanted')
end
if not epoch then
  return redis.error_reply('ERR transfer_take: the epoch must be 1 or more')
end

local open = redis.call('HGET', KEYS[3], t)
if open then
  local _, units = string.match(open, '^(%S+) (%d+)')
  return {0, 'taken', tonumber(units)}
end
local last = redis.call('HGET', KEYS[3], 'last')
if last and (#t < #last or (#t == #last and t <= last)) then
  return {4, 'stale id', tonumber(last)}
end
local meta = redis.call('HMGET', KEYS[1], 'paused', 'mover_epoch', 'begin_ms')
local seen = epoch_seen(meta[2])
local refused = fenced(epoch, seen)
if refused then return refused end
if not meta[3] then return {5, 'not loaded', 0} end
if meta[1] == '1' or not server_checked(KEYS[1]) then return {2, 'paused', 0} end
local stock = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
if stock < least then return {1, 'short', math.max(stock, 0)} end

local units = math.min(stock, want)
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
redis.call('DECRBY', KEYS[2], units)
redis.call('HSET', KEYS[3], t, to .. ' ' .. units .. ' ' .. now_ms, 'last', t)
-- A bucket's units kept for the mover's moves (meta lent,
-- lua/serve_up_to.lua) leave with them: what is left of them stays kept,
-- no more than the stock left (a take short of what it wanted emptied it:
-- units that come back later are not kept for a move already made).
if string.sub(KEYS[2], -6) == ':stock' then
  local lent = tonumber(redis.call('HGET', KEYS[1], 'lent') or '')
  local kept = lent and math.min(lent - units, stock - units)
  if kept and kept > 0 then
    redis.call('HSET', KEYS[1], 'lent', string.format('%d', kept))
  elseif lent then
    redis.call('HDEL', KEYS[1], 'lent', 'lent_until')
  end
end
see_epoch(KEYS[1], epoch, seen)
return {0, 'taken', units}
