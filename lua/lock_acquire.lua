-- lock_acquire.lua — layer 3: take the per-(user, voucher) lease locks of a
-- whole batch in one round trip.
--
-- KEYS[1]  seckill:{V}:locks   hash user -> "<expires_ms> <count> <owner>"
--                              (lua/lib/lease.lua, which the binary prepends)
-- ARGV[1]  owner token (unique per worker instance)
-- ARGV[2]  lease in milliseconds
-- ARGV[3..] user ids, one per message of the batch (all of voucher V)
--
-- Returns an array with one element per user: 1 when the owner now holds the
-- lock (a second acquisition by the same owner, in this call or an earlier
-- one, counts one more reentry), 0 when another owner holds it. A held lock
-- expires after the lease unless renewed (lock_renew.lua).

local owner, lease, users, now, state = lease_args()
local changed, out = {}, {}
for i, user in ipairs(users) do
  local lock = state[user]
  if lease_held(lock, owner, now) then
    lock[1], lock[2] = now + lease, lock[2] + 1
  elseif lock and lock[1] > now then
    out[i] = 0
  else
    state[user] = { now + lease, 1, owner }
  end
  if not out[i] then
    out[i] = 1
    changed[user] = true
  end
end
lease_write(KEYS[1], state, changed, lease)
return out
