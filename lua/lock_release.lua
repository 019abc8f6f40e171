-- lock_release.lua — layer 3: give back the owner's locks (one reentry each).
--
-- KEYS[i]  seckill:{V}:lock:<user>
-- ARGV[1]  owner token
--
-- Returns how many keys were released. A key whose count drops to 0 is
-- deleted; a key held by someone else is left alone (never release by name
-- alone: only the owner's token releases).
--
-- `unlock` comes from lua/lib/unlock.lua, which the binary prepends (to run
-- this file by hand, prepend it too).

local released = 0
for _, key in ipairs(KEYS) do
  if unlock(key, ARGV[1]) then released = released + 1 end
end
flush_unlocks()
return released
