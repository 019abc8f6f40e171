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
-- lock, 0 when another owner holds it. The lock's count is the number of
-- times its user is listed in this call, also when the owner held it
-- already (then it is renewed and its count set, not added to): a worker
-- lane takes a batch's locks in one call and gives them back in one, so no
-- caller counts reentries across calls. A held lock expires after the lease
-- unless renewed (lock_renew.lua).
--
-- Safe to run twice: a replay finds the locks its first run took held by
-- the same owner and sets the same counts again (the lease runs from the
-- replay), so the caller's one release still frees them (a count added to
-- would keep the lock past the batch, blocking other workers until the
-- lease ran out).

local owner, lease, users = ARGV[1], tonumber(ARGV[2]), lease_users(3)
local now, once = lease_now(), lease_once(owner)
local expires = now + lease
local vals = lease_values(KEYS[1], users)
-- user -> the owner's count after this call, or false: someone else's.
local counts, out = {}, {}
for i, user in ipairs(users) do
  local c = counts[user]
  if c == nil then
    local v = vals[i]
    -- The owner's (held or run out) or free: counted from this call alone.
    -- Another owner's is free only once its lease ran out.
    if lease_count(v, owner, now, once) ~= nil or lease_expiry(v) <= now then
      c = 0
    else
      c = false
    end
  end
  if c then
    counts[user] = c + 1
    out[i] = 1
  else
    counts[user] = false
    out[i] = 0
  end
end
local fresh = string.format('%d', expires) .. once
local set = {}
for user, c in pairs(counts) do
  if c then
    set[#set + 1] = user
    set[#set + 1] = (c == 1) and fresh or string.format('%d %d %s', expires, c, owner)
  end
end
lease_store(KEYS[1], set, {}, lease)
return out
