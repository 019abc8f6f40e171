-- lock_renew.lua — layer 3 watchdog: extend the leases the owner still holds.
--
-- KEYS[1]  seckill:{V}:locks   (lua/lib/lease.lua, which the binary prepends)
-- ARGV[1]  owner token
-- ARGV[2]  lease in milliseconds
-- ARGV[3..] user ids
--
-- Returns an array with one element per user: 1 renewed, 0 lost (expired,
-- or taken by another owner after it expired).

local owner, lease, users, now, state = lease_args()
local changed, out = {}, {}
for i, user in ipairs(users) do
  local lock = state[user]
  if lease_held(lock, owner, now) then
    lock[1] = now + lease
    changed[user] = true
    out[i] = 1
  else
    out[i] = 0
  end
end
lease_write(KEYS[1], state, changed, lease)
return out
