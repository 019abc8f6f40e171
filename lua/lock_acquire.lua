-- lock_acquire.lua — layer 3: take the per-(user, voucher) lease locks of a
-- whole batch in one round trip.
--
-- KEYS[i]  seckill:{V}:lock:<user>   one per message of the batch (all of one
--                                    voucher, so one cluster slot)
-- ARGV[1]  owner token (unique per worker instance)
-- ARGV[2]  lease in milliseconds
--
-- Returns an array with one element per key: 1 when the owner now holds the
-- lock (a second acquisition by the same owner counts one more reentry), 0
-- when another owner holds it. A held lock expires after the lease unless
-- renewed (lock_renew.lua); it is a hash owner -> reentry count.

local out = {}
for i, key in ipairs(KEYS) do
  if redis.call('EXISTS', key) == 0 or redis.call('HEXISTS', key, ARGV[1]) == 1 then
    redis.call('HINCRBY', key, ARGV[1], 1)
    redis.call('PEXPIRE', key, ARGV[2])
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
