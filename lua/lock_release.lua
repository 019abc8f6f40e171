-- lock_release.lua — layer 3: give back the owner's locks (one count per listing).
--
-- KEYS[1]  seckill:{V}:locks   (lua/lib/lease.lua, which the binary prepends)
-- ARGV[1]  owner token
-- ARGV[2..] user ids
--
-- Returns how many locks were released. A lock whose count drops to 0 is
-- deleted; a lock held by someone else is left alone (never release by name
-- alone: only the owner's token releases).
--
-- Safe to run twice: the worker releases as often as it listed each user
-- when acquiring, so the first run deletes its locks and the replay finds
-- none of the owner's (returns 0); the owner takes no lock in between (a
-- lane waits for this reply), and another owner's lock is never touched.

return lease_release(KEYS[1], ARGV[1], lease_users(2))
