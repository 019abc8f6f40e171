-- transfer_void.lua — completing a transfer whose mover stopped between
-- take and give (design/buckets.md): the receiver is asked first. Internal
-- to `seckill worker`'s mover and to reconcile.
--
-- If the transfer reached the receiver, it stays given; if not, it is
-- marked void there, so a give arriving later (a stalled mover) lands
-- nothing, and the giver may take the units back (lua/transfer_settle.lua
-- with "void"). Only after this call may units in transit go back.
--
-- KEYS[1]  the receiver's transfers received: seckill:{V.b.s}:received, or
--          seckill:{V}:pool_received; hash id -> "given" or "void"
-- ARGV[1]  transfer id
--
-- Returns "given" (settle as given) or "void" (settle as void).
-- Safe to run twice: the first answer stands.

if not valid_id(ARGV[1]) then return redis.error_reply('ERR transfer_void: bad transfer id') end
redis.call('HSETNX', KEYS[1], ARGV[1], 'void')
return redis.call('HGET', KEYS[1], ARGV[1])
