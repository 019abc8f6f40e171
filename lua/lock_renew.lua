-- lock_renew.lua — layer 3 watchdog: extend the leases the owner still holds.
--
-- KEYS[i]  seckill:{V}:lock:<user>
-- ARGV[1]  owner token
-- ARGV[2]  lease in milliseconds
--
-- Returns an array with one element per key: 1 renewed, 0 lost (expired, or
-- taken by another owner after it expired).

local out = {}
for i, key in ipairs(KEYS) do
  if redis.call('HEXISTS', key, ARGV[1]) == 1 then
    redis.call('PEXPIRE', key, ARGV[2])
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
