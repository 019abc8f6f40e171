-- fence.lua — who holds a voucher's MySQL row lock, and until when.
--
-- A worker's MySQL transaction locks the voucher's row from its first
-- stock update to COMMIT. A worker that stops inside it (SIGSTOP, a VM
-- freeze, a hung runtime) would hold every other worker and every
-- cancellation of that voucher for as long as its session lives (hours).
-- So before it takes the row lock a worker enters its MySQL connection id
-- here under a lease it renews while the transaction runs (the batch's
-- keep-alive); a worker whose lock wait timed out asks for the entries whose
-- lease ran out, ends those sessions if they have been idle since (KILL: its
-- own MySQL user's, no privilege needed) and only then forgets the entries.
--
-- KEYS[1]  seckill:{V}:fence   hash  owner token -> "<expires_ms> <mysql connection id> <lease_ms>"
--                                    (expiry by Redis TIME; the key itself
--                                    lives a day past its last write)
-- ARGV[1]  "enter", "renew", "leave", "expired" or "forget"
-- enter:   ARGV[2] owner token, ARGV[3] lease ms, ARGV[4] MySQL connection id
-- renew:   ARGV[2] owner token, ARGV[3] lease ms, ARGV[4] optional connection
--          id: enters it again if the entry is gone (Redis lost it)
-- leave:   ARGV[2] owner token
-- expired: (nothing more)
-- forget:  ARGV[2] owner token, ARGV[3] the connection id ended: the entry
--          goes only if it still names that id and its lease still ran out
--
-- Returns enter/renew/leave/forget: 1 done, 0 nothing to do;
--   expired: a flat array of owner, connection id, and how long ago (ms) the
--   lease was last renewed, for each entry whose lease ran out and whose id
--   no live entry names (a live holder's session is never a candidate).
--
-- Safe to run twice: enter, renew, leave and forget set what they set;
-- expired only reads.

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- expires, id, lease of a stored entry (nil when malformed).
local function parse(v)
  local e, id, lease = string.match(v or '', '^(%d+) (%d+) (%d+)$')
  if not e then return nil end
  return tonumber(e), id, tonumber(lease)
end

local action, owner = ARGV[1], ARGV[2]
if action == 'expired' then
  local flat, now = redis.call('HGETALL', KEYS[1]), now_ms()
  local live, lapsed = {}, {}
  for i = 1, #flat, 2 do
    local e, id, lease = parse(flat[i + 1])
    if e and e > now then
      live[id] = true
    elseif e then
      lapsed[#lapsed + 1] = {flat[i], id, now - (e - lease)}
    end
  end
  local out = {}
  for _, l in ipairs(lapsed) do
    if not live[l[2]] then
      out[#out + 1] = l[1]; out[#out + 1] = l[2]; out[#out + 1] = l[3]
    end
  end
  return out
end
if not owner or owner == '' then
  return redis.error_reply('ERR fence.lua: ' .. tostring(action) .. ' needs an owner token')
end
if action == 'leave' then return redis.call('HDEL', KEYS[1], owner) end
if action == 'forget' then
  local e, id = parse(redis.call('HGET', KEYS[1], owner))
  if e and id == ARGV[3] and e <= now_ms() then return redis.call('HDEL', KEYS[1], owner) end
  return 0
end
local lease = tonumber(ARGV[3])
if not lease or lease <= 0 then return redis.error_reply('ERR fence.lua: ARGV[3] must be a lease in ms') end
local id = ARGV[4]
if id and id ~= '' and not string.match(id, '^%d+$') then
  return redis.error_reply('ERR fence.lua: ARGV[4] must be a MySQL connection id')
end
if action == 'enter' then
  if not id or id == '' then return redis.error_reply('ERR fence.lua: enter needs a MySQL connection id') end
elseif action == 'renew' then
  local _, stored = parse(redis.call('HGET', KEYS[1], owner))
  if stored then
    id = stored
  elseif not id or id == '' then
    return 0
  end
else
  return redis.error_reply('ERR fence.lua: ARGV[1] must be enter, renew, leave, expired or forget')
end
redis.call('HSET', KEYS[1], owner, string.format('%d %s %d', now_ms() + lease, id, lease))
-- The key outlives a lapsed entry by far: a taker must still find the
-- session of a holder that stopped (its entry is the only trace of it).
redis.call('PEXPIRE', KEYS[1], 86400000)
return 1
