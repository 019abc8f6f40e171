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
--                             mover_epoch
-- ARGV[1]  "take" (take or renew) or "release"
-- ARGV[2]  the owner token (unique per worker process)
-- ARGV[3]  take: the lease in ms
-- ARGV[4]  take, optional: the least epoch to hold it at. A mover that a
--          gate fenced with epoch e (its epoch fell behind, say bucket 0's
--          meta lost the last takeovers) takes the lease again at e + 1.
--
-- Returns the epoch while the caller holds the lease (take), 0 when
-- another holds it; release returns 1 if it held the lease, else 0.
-- Safe to run twice: a renewal by the holder keeps the epoch.

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
if action ~= 'take' then return redis.error_reply('ERR mover_lease: take or release') end
local lease = tonumber(ARGV[3])
if not lease or lease < 1 then return redis.error_reply('ERR mover_lease: the lease must be 1 ms or more') end
if holder and holder ~= owner and expires > now then return 0 end
local floor = tonumber(ARGV[4] or '0') or 0
if holder ~= owner or floor > epoch then
  if holder ~= owner then epoch = epoch + 1 end
  epoch = math.max(epoch, floor)
  redis.call('HSET', KEYS[1], 'mover_epoch', epoch)
end
redis.call('HSET', KEYS[1], 'mover', owner .. ' ' .. string.format('%d', now + lease))
return epoch
