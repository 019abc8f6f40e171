-- lib/unlock.lua — prepended by the binary to lua/lock_release.lua and
-- lua/finish.lua, which both give back lease locks (DESIGN.md §5, layer 3).

-- Keys whose last reentry was given back, deleted together by
-- flush_unlocks() (one DEL for the batch, not one per lock).
local unlocked_keys = {}
local unlocked = {}

-- Gives back one reentry of `owner` on `key`; true if the owner held it.
-- The key goes when its count reaches 0; a key held by someone else is left
-- alone (never release by name alone). Reading first keeps the common case
-- (held once) to a single read here and a share of one DEL. A key already
-- given back in this script is not held any more.
local function unlock(key, owner)
  if unlocked[key] then return false end
  local count = tonumber(redis.call('HGET', key, owner))
  if not count then return false end
  if count <= 1 then
    unlocked[key] = true
    unlocked_keys[#unlocked_keys + 1] = key
  else
    redis.call('HINCRBY', key, owner, -1)
  end
  return true
end

-- Deletes the keys unlock() gave back; every caller ends with it.
local function flush_unlocks()
  for j = 1, #unlocked_keys, 1000 do
    redis.call('DEL', unpack(unlocked_keys, j, math.min(j + 999, #unlocked_keys)))
  end
end
