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
-- KEYS[2]  seckill:{V}:mover_holds  sorted set owner -> expiry ms: who
--                             holds the mover still (seize, unseize; take
--                             refuses the lease while one is live; optional
--                             for take, release and fence)
-- ARGV[1]  "take" (take or renew), "release", "seize", "unseize", "holds"
--          (is ARGV[2]'s hold live: 1 or 0) or "fence"
-- ARGV[2]  the owner token (unique per worker process)
-- ARGV[3]  take, seize: the lease in ms; fence: the epoch
-- ARGV[4]  take, optional: the least epoch to hold it at. A mover that a
--          gate fenced with epoch e (its epoch fell behind, say bucket 0's
--          meta lost the last takeovers) takes the lease again at e + 1.
--
-- seize: the gate guard about to rebuild a bucket (worker/guard.rs), or
-- reconcile, holds the mover still for ARGV[3] ms, whoever holds the
-- lease, and raises the epoch far (by 2^20); it then fences every bucket
-- with that epoch ("fence": mover_epoch raised to ARGV[3] in a loaded
-- gate's meta), so no take or give of a mover under an older epoch lands
-- while it counts the voucher's units, and no mover takes or renews the
-- lease until the hold is given back (unseize) or ran out. One holder at
-- a time: a seize while another's hold is live returns 0.
--
-- Returns the epoch while the caller holds the lease (take) or the mover
-- still (seize), 0 when another holds it (or holds it still); release and
-- unseize return 1 if the caller held it, else 0; fence the gate's epoch
-- now (0: the gate is not loaded, nothing written).
-- Safe to run twice: a renewal by the holder keeps the epoch; a seize sent
-- again renews the hold and raises the epoch once more (a harder fence); a
-- fence only raises.

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
local holds = KEYS[2]
if action == 'unseize' then
  if not holds then return redis.error_reply('ERR mover_lease: unseize needs the holds key') end
  -- The lease a seize wrote for movers that pass no holds key (an older
  -- binary's) goes with the hold.
  if holder == owner then redis.call('HDEL', KEYS[1], 'mover') end
  return redis.call('ZREM', holds, owner)
end
if action == 'holds' then
  if not holds then return redis.error_reply('ERR mover_lease: holds needs the holds key') end
  local until_ms = tonumber(redis.call('ZSCORE', holds, owner) or '0') or 0
  if until_ms > now then return 1 end
  return 0
end
if action ~= 'take' and action ~= 'seize' then
  return redis.error_reply('ERR mover_lease: take, release, seize, unseize, holds or fence')
end
local lease = tonumber(ARGV[3])
if not lease or lease < 1 then return redis.error_reply('ERR mover_lease: the lease must be 1 ms or more') end
if action == 'seize' then
  if not holds then return redis.error_reply('ERR mover_lease: seize needs the holds key') end
  -- One count at a time: two rebuilds reading at once would each give
  -- their bucket the units the other is about to give its own.
  redis.call('ZREMRANGEBYSCORE', holds, '-inf', now)
  local others = redis.call('ZRANGE', holds, 0, -1)
  for _, other in ipairs(others) do
    if other ~= owner then return 0 end
  end
  redis.call('ZADD', holds, now + lease, owner)
  if redis.call('PTTL', holds) < lease then redis.call('PEXPIRE', holds, lease) end
  -- Far above any epoch a mover may hold: this meta may have lost the
  -- takeovers that handed out the last ones (the very failover a rebuild
  -- follows), and a mover whose epoch no gate has seen yet passes a fence
  -- of one more than the highest recorded.
  epoch = epoch + 1048576
  -- The lease too, for a mover that passes no holds key (an older
  -- binary's take sees another holder and moves nothing).
  redis.call('HSET', KEYS[1], 'mover_epoch', epoch,
    'mover', owner .. ' ' .. string.format('%d', now + lease))
  return epoch
end
if holds then
  redis.call('ZREMRANGEBYSCORE', holds, '-inf', now)
  if redis.call('ZCARD', holds) > 0 then return 0 end
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
