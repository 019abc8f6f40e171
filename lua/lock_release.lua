-- lock_release.lua — layer 3: give back the owner's locks (one reentry each).
--
-- KEYS[i]  seckill:{V}:lock:<user>
-- ARGV[1]  owner token
--
-- Returns how many keys were released. A key whose count drops to 0 is
-- deleted; a key held by someone else is left alone (never release by name
-- alone: only the owner's token releases).

local released = 0
for _, key in ipairs(KEYS) do
  -- Reading first keeps the common case (held once) to a single write.
  local count = tonumber(redis.call('HGET', key, ARGV[1]))
  if count then
    if count <= 1 then
      redis.call('DEL', key)
    else
      redis.call('HINCRBY', key, ARGV[1], -1)
    end
    released = released + 1
  end
end
return released
