-- lib/server_checked.lua — whether a gate is on the Redis server its state
-- was last checked on, prepended by the binary to the scripts of lua/ named
-- below (to run one of them by hand, prepend this file too).
-- Used by: preload.lua, serve_up_to.lua, transfer_give.lua, transfer_take.lua
--
-- A gate's meta records in `run_id` the run id of the server its state was
-- last checked against MySQL on: preload's, and the worker's gate guard's
-- once it has dealt with a restart or a failover (lua/run_id.lua). A
-- server with another run id restarted or took over since, and may have
-- come back from older data: units it shows as free may be sold already.
-- Nothing may draw on such a gate (take, give, serve, bound) until the
-- guard has checked it and recorded the new id.

-- This server's run id (nil where INFO is refused: no check then).
local function this_run_id()
  local ok, info = pcall(redis.call, 'INFO', 'server')
  if not ok or type(info) ~= 'string' then return nil end
  return string.match(info, 'run_id:(%x+)')
end

-- False when `meta` records the run id of another server than this one.
local function server_checked(meta)
  local recorded = redis.call('HGET', meta, 'run_id')
  if not recorded then return true end
  local now = this_run_id()
  return now == nil or now == recorded
end
