-- lock_release.lua — layer 3: give back the owner's locks (one reentry each).
--
-- KEYS[1]  seckill:{V}:locks   (lua/lib/lease.lua, which the binary prepends)
-- ARGV[1]  owner token
-- ARGV[2..] user ids
--
-- Returns how many locks were released. A lock whose count drops to 0 is
-- deleted; a lock held by someone else is left alone (never release by name
-- alone: only the owner's token releases).

return lease_release(KEYS[1], ARGV[1], lease_users(2))
