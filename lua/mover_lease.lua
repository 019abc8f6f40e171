-- mover_lease.lua — the lease of the one mover of a voucher split into
-- buckets (design/buckets.md), in bucket 0's meta. Internal to `seckill
-- worker`.
--
-- One worker at a time moves a voucher's stock: it takes the lease, renews
-- it each round, and every take and give it makes carries the lease's
-- epoch. A worker that takes the lease over from another (expired, or
-- released) raises the epoch, so a mover that lost its lease is refused by
-- every gate the new one has touched (lua/transfer_take.lua,
-- transfer_give.lua).
--
-- KEYS[1]  seckill:{V}:meta   fields mover ("<owner> <expires_ms>") and
--                             mover_epoch (fence: any bucket's meta,
--                             seckill:{V.b.s}:meta)
-- ARGV[1]  "take" (take or renew), "release", "seize" or "fence"
-- ARGV[2]  the owner token (unique per worker process)
-- ARGV[3]  take, seize: the lease in ms; fence: the epoch
-- ARGV[4]  take, optional: the least epoch to hold it at. A mover that a
--          gate fenced with epoch e (its epoch fell behind, say bucket 0's
--          meta lost the last takeovers) takes the lease again at e + 1.
--
-- seize: the gate guard, about to rebuild a bucket (worker/guard.rs),
-- takes the lease whoever holds it and raises the epoch; it then fences
-- every bucket with that epoch ("fence": mover_epoch raised to ARGV[3] in
-- a loaded gate's meta), so no take or give of the mover it displaced
-- lands while it reads the voucher's units, and gives the lease back.
--
-- Returns the epoch while the caller holds the lease (take, seize), 0 when
-- another holds it; release returns 1 if it held the lease, else 0; fence
-- the gate's epoch now (0: the gate is not loaded, nothing written).
-- Safe to run twice: a renewal by the holder keeps the epoch; a seize sent
-- again raises it once more (a harder fence, the same holder); a fence
-- only raises.

local action, owner = ARGV[1], ARGV[2]
if not owner or owner == '' or string.find(owner, ' ', 1, true) then
  return redis.error_reply('ERR mover_lease: the owner must be a token without spaces')
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local held = redis.call('HMGET', KEYS[1], 'mover', 'mover_epoch')
local holder, expires = nil, 0
if held[1] then holder, expires = string.match(held[1], '^(%S+) (%d+)$') end
expires = tonumber(expires) or 0
local epoch = tonumber(held[2] or '0') or 0

if action == 'release' then
  if holder == owner then
    redis.call('HDEL', KEYS[1], 'mover')
    return 1
  end
  return 0
end
if action == 'fence' then
  local at = tonumber(ARGV[3])
  if not at or at < 1 or at ~= math.floor(at) then
    return redis.error_reply('ERR mover_lease: the fence epoch must be 1 or more')
  end
  -- Not into a gate that is gone: a meta of one field would read as loaded.
  if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
  if at > epoch then
    epoch = at
    redis.call('HSET', KEYS[1], 'mover_epoch', epoch)
  end
  return epoch
end
if action ~= 'take' and action ~= 'seize' then
  return redis.error_reply('ERR mover_lease: take, release, seize or fence')
end
local lease = tonumber(ARGV[3])
if not lease or lease < 1 then return redis.error_reply('ERR mover_lease: the lease must be 1 ms or more') end
if action == 'seize' then
  epoch = epoch + 1
  redis.call('HSET', KEYS[1], 'mover_epoch', epoch,
    'mover', owner .. ' ' .. string.format('%d', now + lease))
  return epoch
end
if holder and holder ~= owner and expires > now then return 0 end
local floor = tonumber(ARGV[4] or '0') or 0
if holder ~= owner or floor > epoch then
  if holder ~= owner then epoch = epoch + 1 end
  epoch = math.max(epoch, floor)
  redis.call('HSET', KEYS[1], 'mover_epoch', epoch)
end
redis.call('HSET', KEYS[1], 'mover', owner .. ' ' .. string.format('%d', now + lease))
return epoch
