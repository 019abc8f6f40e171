-- lib/mover_epoch.lua — the mover's epoch fence, one check for every script
-- a mover calls with its lease's epoch (lua/mover_lease.lua), prepended by
-- the binary to the scripts of lua/ named below (to run one of them by
-- hand, prepend this file too).
-- Used by: serve_up_to.lua, transfer_give.lua, transfer_take.lua
--
-- A gate's meta records in `mover_epoch` the highest epoch a mover wrote
-- to it with. A mover of a lower epoch lost its lease to a later one and
-- is refused, {3, "fenced", seen}, before the script writes anything: the
-- same code in every script. A higher epoch is recorded when the script
-- writes.

-- ARGV's epoch as a number, or nil when it is not a whole number of 1 or
-- more (the caller answers its own error reply).
local function mover_epoch(arg)
  local epoch = tonumber(arg)
  if not epoch or epoch < 1 or epoch ~= math.floor(epoch) then return nil end
  return epoch
end

-- The epoch a gate has seen, from its meta field `mover_epoch` as read.
local function epoch_seen(field)
  return tonumber(field or '0') or 0
end

-- The refusal of a mover older than the one the gate has seen; nil when
-- it is not fenced.
local function fenced(epoch, seen)
  if epoch < seen then return {3, 'fenced', seen} end
  return nil
end

-- Records `epoch` in the gate's meta when it is above the one seen.
local function see_epoch(meta, epoch, seen)
  if epoch > seen then redis.call('HSET', meta, 'mover_epoch', epoch) end
end
