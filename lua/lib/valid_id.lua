-- lib/valid_id.lua — the check of an id, prepended by the binary to the
-- scripts of lua/ named below (to run one of them by hand, prepend this file
-- too).
-- Used by: requeue.lua, transfer_give.lua, transfer_settle.lua, transfer_take.lua, transfer_void.lua
--
-- An id is a decimal integer 1 .. 9223372036854775807, the rule
-- lua/seckill.lua applies (that one stays a single self-contained file,
-- because application servers load it as it is).

local function valid_id(s)
  return type(s) == 'string' and string.match(s, '^[1-9][0-9]*$') ~= nil
    and (#s < 19 or (#s == 19 and s <= '9223372036854775807'))
end
