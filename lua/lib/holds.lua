-- lib/holds.lua — whether a worker holds a voucher's gate, prepended by the
-- binary to the scripts of lua/ named below (to run one of them by hand,
-- prepend this file too).
-- Used by: pause.lua, preload.lua, reconcile.lua, release.lua
--
-- seckill:{V}:holds (written by lua/pause.lua): worker token -> expiry (Redis
-- TIME, ms). A live hold means a worker has a batch in hand whose entries
-- Redis lost: no view of the stores counts it until it commits, so nothing
-- may reopen the gate, publish it open, or give units back on such a view.
-- A pause's grace (meta reopen_after_ms, lua/pause.lua) is the time such a
-- worker has to see its batch lost and take the hold: while it runs, a
-- hold may still come, so nothing gives units back either.

local function holds_now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Whether any hold in `key` still runs (no key: none).
local function hold_is_live(key)
  if not key then return false end
  local now = holds_now_ms()
  local expiries = redis.call('HVALS', key)
  for i = 1, #expiries do
    if (tonumber(expiries[i]) or 0) > now then return true end
  end
  return false
end

-- Whether a pause's grace still runs on the gate whose meta is `meta` (no
-- key: none). A worker holding a batch whose entries Redis lost holds the
-- gate at its keep-alive's next tick, within the grace: a unit given back
-- (a promotion) before then may be that batch's.
local function grace_runs(meta)
  if not meta then return false end
  return (tonumber(redis.call('HGET', meta, 'reopen_after_ms')) or 0) > holds_now_ms()
end
