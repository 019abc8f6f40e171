-- transfer_settle.lua — moving stock between buckets, step 3 of 3: the
-- giver drops its record of a transfer the receiver answered for (design/
-- buckets.md). Internal to `seckill worker`'s mover and to reconcile.
--
-- "given": the units are the receiver's (lua/transfer_give.lua said so):
-- the record goes. "void": the receiver marked the transfer void
-- (lua/transfer_void.lua), so its units never arrived: they go back to the
-- giver's stock, once, and the record goes. Calling "void" without that
-- mark would let a late give land the units a second time.
--
-- KEYS[1]  the giver's meta (the pool's: bucket 0's): field paused
-- KEYS[2]  the giver's units: seckill:{V.b.s}:stock, or seckill:{V}:pool
-- KEYS[3]  the giver's open transfers: seckill:{V.b.s}:transfers, or
--          seckill:{V}:pool_transfers
-- ARGV[1]  transfer id
-- ARGV[2]  "given" or "void": what the receiver answered
--
-- Returns {code, units}: {0, units back in the giver's stock (0 for
-- "given")}, {1, 0} no such open record (settled before: nothing done),
-- {2, 0} "void" while the giver is paused (being rebuilt: the record
-- stays, in transit, and is settled after).
--
-- Safe to run twice: the record is gone after the first run.

local t, outcome = ARGV[1], ARGV[2]
if not valid_id(t) then return redis.error_reply('ERR transfer_settle: bad transfer id') end
if outcome ~= 'given' and outcome ~= 'void' then
  return redis.error_reply('ERR transfer_settle: the outcome must be "given" or "void"')
end
local open = redis.call('HGET', KEYS[3], t)
if not open then return {1, 0} end
if outcome == 'given' then
  redis.call('HDEL', KEYS[3], t)
  return {0, 0}
end
if redis.call('HGET', KEYS[1], 'paused') == '1' then return {2, 0} end
local _, units = string.match(open, '^(%S+) (%d+)')
redis.call('INCRBY', KEYS[2], units)
redis.call('HDEL', KEYS[3], t)
return {0, tonumber(units)}
