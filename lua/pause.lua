-- pause.lua — pause or reopen a voucher's gate (the worker's gate guard,
-- while the gate is rebuilt after Redis lost writes MySQL holds; reconcile
-- and preload reopen a gate they found or made consistent), and the holds
-- that keep it paused. A paused gate answers every attempt {6, "paused", 0}
-- and writes nothing.
--
-- A hold is a worker's word that it has a batch in hand whose entries the
-- gate no longer has (Redis lost them): no view of the stores counts that
-- batch until it is committed, so no gate may reopen on one. A hold lives
-- for a lease and is renewed while the batch is in hand; a worker that dies
-- or freezes holds nobody up for longer than that.
--
-- KEYS[1]  seckill:{V}:meta     hash   fields paused = 1 while paused,
--                                      reopen_after_ms (Redis TIME) while a
--                                      pause's grace runs, and pause_token:
--                                      the Redis time (us) of the latest pause
-- KEYS[2]  seckill:{V}:buyers   set
-- KEYS[3]  seckill:{V}:holds    hash   owner token -> hold expiry (Redis TIME ms);
--                                      required by reopen, hold and unhold
-- ARGV[1]  "pause", "reopen", "hold", "unhold" or "held"
-- pause:   ARGV[2] optional: how many orders MySQL holds for the voucher, read
--                  before this call (every order's user is a buyer unless
--                  Redis lost writes); given, the gate is paused only if it
--                  has fewer buyers than that (checked in the same step)
--          ARGV[3] optional: a grace in ms (0 when absent) before which no
--                  reopen succeeds: workers whose batches Redis lost take it
--                  to notice and hold the gate. A pause of a gate already
--                  paused extends a shorter grace.
--          ARGV[4] optional: why, written to meta's paused_reason
--                  (`redis_lost_writes`, `mysql_lost_commits`) for `status`;
--                  the latest pause's reason is kept, and a reopen drops it
-- reopen:  ARGV[2] required: the order count; the gate reopens only if it has
--                  at least that many buyers, its grace has run out and no
--                  worker holds it
--          ARGV[3] optional: the pause_token the caller's view of the gate
--                  was read with ('' if it saw none); given, the gate
--                  reopens only if no pause came since (a guard that paused
--                  it after that view was read knows something it does not),
--                  and no hold ended since (given back or lapsed: its batch
--                  may have committed after the view read MySQL; each renews
--                  the pause_token of a paused gate)
-- hold:    ARGV[2] owner token, ARGV[3] lease in ms
-- unhold:  ARGV[2] owner token
-- held:    (nothing more) whether any worker holds the gate
--
-- Returns -1 when the gate is not loaded (nothing to pause or reopen: a hold
--   is stored all the same, for the gate a rebuild publishes);
--   pause:  1 paused now, 2 it was paused already, 0 not paused (enough buyers)
--   reopen: 1 reopened, 2 it was not paused, 0 it stays paused (too few
--           buyers), 3 it stays paused (its grace runs, or a worker holds it),
--           4 it stays paused (paused again since the caller's view)
--   hold:   1 (the gate is paused), 0 (it is open)
--   unhold: 1 a hold was given back (a paused gate's pause_token renewed),
--           0 there was none
--   held:   1 a worker holds the gate, 0 none does (whether loaded or not)
--
-- Safe to run twice: pause and hold set what they set already (a replayed
-- grace or hold ends a few ms later), reopen and unhold find nothing left
-- to do.

-- `holds_now_ms`, `hold_is_live` and `grace_runs` come from lua/lib/holds.lua, which the
-- binary prepends (to run this file by hand, prepend it too).
local now_ms = holds_now_ms

-- A new pause_token, if the gate is paused: views read before now are too
-- old to reopen on.
local function renew_pause_token()
  if redis.call('HGET', KEYS[1], 'paused') ~= '1' then return end
  local t = redis.call('TIME')
  redis.call('HSET', KEYS[1], 'pause_token', t[1] .. string.format('%06d', tonumber(t[2])))
end

-- Whether a worker's hold still runs (expired ones are dropped here). A
-- hold that ends, given back or lapsed, ends a time in which the batch it
-- stood for may have committed unseen by a view read meanwhile: such a view
-- judged the gate against a MySQL that no longer is, so the pause_token is
-- renewed and no reopen succeeds on it.
local function held(key)
  local now = now_ms()
  local flat = redis.call('HGETALL', key)
  for i = 1, #flat, 2 do
    if (tonumber(flat[i + 1]) or 0) <= now then
      redis.call('HDEL', key, flat[i])
      renew_pause_token()
    end
  end
  return hold_is_live(key)
end

local action = ARGV[1]
if action == 'held' then
  if not KEYS[3] then return redis.error_reply('ERR pause.lua: held needs the holds key') end
  return held(KEYS[3]) and 1 or 0
end
if action == 'hold' or action == 'unhold' then
  if not KEYS[3] or not ARGV[2] or ARGV[2] == '' then
    return redis.error_reply('ERR pause.lua: ' .. action .. ' needs the holds key and an owner')
  end
  if action == 'unhold' then
    local given = redis.call('HDEL', KEYS[3], ARGV[2])
    if given == 1 then renew_pause_token() end
    return given
  end
  local lease = tonumber(ARGV[3])
  if not lease or lease <= 0 then
    return redis.error_reply('ERR pause.lua: hold needs a lease in ms')
  end
  redis.call('HSET', KEYS[3], ARGV[2], string.format('%d', now_ms() + lease))
  -- The key outlives its holds by far: a lapsed hold must be found and
  -- dropped (renewing the pause token, above), not vanish with the key.
  redis.call('PEXPIRE', KEYS[3], math.max(lease, 86400000))
  if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
  return redis.call('HGET', KEYS[1], 'paused') == '1' and 1 or 0
end

if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
local paused = redis.call('HGET', KEYS[1], 'paused') == '1'
local orders = ARGV[2] and ARGV[2] ~= '' and tonumber(ARGV[2])
if ARGV[2] and ARGV[2] ~= '' and not orders then
  return redis.error_reply('ERR pause.lua: ARGV[2] must be an order count')
end
if action == 'pause' then
  local grace = tonumber(ARGV[3] or '0')
  if not grace then return redis.error_reply('ERR pause.lua: ARGV[3] must be a grace in ms') end
  if not paused and orders and redis.call('SCARD', KEYS[2]) >= orders then return 0 end
  -- Every pause, of an open gate or a paused one, makes views read before
  -- it too old to reopen on.
  local t = redis.call('TIME')
  redis.call('HSET', KEYS[1], 'pause_token', t[1] .. string.format('%06d', tonumber(t[2])))
  if grace > 0 then
    local after = now_ms() + grace
    if after > (tonumber(redis.call('HGET', KEYS[1], 'reopen_after_ms')) or 0) then
      redis.call('HSET', KEYS[1], 'reopen_after_ms', string.format('%d', after))
    end
  end
  if ARGV[4] and ARGV[4] ~= '' then redis.call('HSET', KEYS[1], 'paused_reason', ARGV[4]) end
  if paused then return 2 end
  redis.call('HSET', KEYS[1], 'paused', '1')
  return 1
elseif action == 'reopen' then
  if not orders then return redis.error_reply('ERR pause.lua: reopen needs the order count') end
  if not KEYS[3] then return redis.error_reply('ERR pause.lua: reopen needs the holds key') end
  if not paused then return 2 end
  -- First: a hold that lapsed renews the token the caller's view is checked against.
  local holding = held(KEYS[3])
  if ARGV[3] and ARGV[3] ~= (redis.call('HGET', KEYS[1], 'pause_token') or '') then return 4 end
  if redis.call('SCARD', KEYS[2]) < orders then return 0 end
  if grace_runs(KEYS[1]) or holding then
    return 3
  end
  redis.call('HDEL', KEYS[1], 'paused', 'reopen_after_ms', 'pause_token', 'paused_reason')
  return 1
end
return redis.error_reply('ERR pause.lua: ARGV[1] must be pause, reopen, hold, unhold or held')
