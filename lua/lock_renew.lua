-- lock_renew.lua — layer 3 watchdog: extend the leases the owner still holds.
--
-- KEYS[1]  seckill:{V}:locks   (lua/lib/lease.lua, which the binary prepends)
-- ARGV[1]  owner token
-- ARGV[2]  lease in milliseconds
-- ARGV[3..] user ids
--
-- Returns an array with one element per user: 1 renewed, 0 lost (expired,
-- or taken by another owner after it expired).
--
-- Safe to run twice: the replay sets the same leases from a moment later.

local owner, lease, users = ARGV[1], tonumber(ARGV[2]), lease_users(3)
local now, once = lease_now(), lease_once(owner)
local vals = lease_values(KEYS[1], users)
local renewed, set, out = {}, {}, {}
for i, user in ipairs(users) do
  local c = lease_count(vals[i], owner, now, once)
  if c and c > 0 then
    if not renewed[user] then
      renewed[user] = true
      set[#set + 1] = user
      set[#set + 1] = string.format('%d %d %s', now + lease, c, owner)
    end
    out[i] = 1
  else
    out[i] = 0
  end
end
lease_store(KEYS[1], set, {}, lease)
return out
