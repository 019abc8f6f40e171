-- lib/unlock.lua — prepended by the binary to lua/lock_release.lua and
-- lua/finish.lua, which both give back lease locks (DESIGN.md §5, layer 3).

-- Gives back one reentry of `owner` on `key`; true if the owner held it.
-- The key goes when its count reaches 0; a key held by someone else is left
-- alone (never release by name alone). Reading first keeps the common case
-- (held once) to a single write.
local function unlock(key, owner)
  local count = tonumber(redis.call('HGET', key, owner))
  if not count then return false end
  if count <= 1 then
    redis.call('DEL', key)
  else
    redis.call('HINCRBY', key, owner, -1)
  end
  return true
end
