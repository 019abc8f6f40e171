-- fence.lua — who holds a voucher's MySQL row lock, and until when.
--
-- A worker's MySQL transaction locks the voucher's row from its first
-- stock update to COMMIT. A worker that stops inside it (SIGSTOP, a VM
-- freeze, a hung runtime) would hold every other worker and every
-- cancellation of that voucher for as long as its session lives (hours).
-- So before it takes the row lock a worker enters its MySQL connection id
-- here under a lease it renews while the transaction runs (the batch's
-- keep-alive); a worker whose lock wait timed out takes the ids whose lease
-- ran out and KILLs those sessions (its own MySQL user's: no privilege
-- needed), which rolls their transactions back and frees the row.
--
-- KEYS[1]  seckill:{V}:fence   hash  owner token -> "<expires_ms> <mysql connection id>"
--                                    (expiry by Redis TIME; the key itself
--                                    lives a day past its last write)
-- ARGV[1]  "enter", "renew", "leave" or "expired"
-- enter:   ARGV[2] owner token, ARGV[3] lease ms, ARGV[4] MySQL connection id
-- renew:   ARGV[2] owner token, ARGV[3] lease ms (nothing when not entered)
-- leave:   ARGV[2] owner token
-- expired: (nothing more)
--
-- Returns enter/renew/leave: 1 done, 0 nothing to do;
--   expired: the connection ids whose lease ran out, removed from the hash
--   (so one taker kills each).
--
-- Safe to run twice: enter, renew and leave set what they set; a replayed
-- "expired" answers nothing more (the first call removed what it took),
-- and the taker's retry takes again if it needs to.

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local action, owner = ARGV[1], ARGV[2]
if action == 'expired' then
  local flat, out, now = redis.call('HGETALL', KEYS[1]), {}, now_ms()
  for i = 1, #flat, 2 do
    local v = flat[i + 1]
    local space = string.find(v, ' ', 1, true)
    if not space or (tonumber(string.sub(v, 1, space - 1)) or 0) <= now then
      redis.call('HDEL', KEYS[1], flat[i])
      if space then out[#out + 1] = string.sub(v, space + 1) end
    end
  end
  return out
end
if not owner or owner == '' then
  return redis.error_reply('ERR fence.lua: ' .. tostring(action) .. ' needs an owner token')
end
if action == 'leave' then return redis.call('HDEL', KEYS[1], owner) end
local lease = tonumber(ARGV[3])
if not lease or lease <= 0 then return redis.error_reply('ERR fence.lua: ARGV[3] must be a lease in ms') end
local id
if action == 'enter' then
  id = ARGV[4]
  if not id or not string.match(id, '^%d+$') then
    return redis.error_reply('ERR fence.lua: enter needs a MySQL connection id')
  end
elseif action == 'renew' then
  local v = redis.call('HGET', KEYS[1], owner)
  local space = v and string.find(v, ' ', 1, true)
  if not space then return 0 end
  id = string.sub(v, space + 1)
else
  return redis.error_reply('ERR fence.lua: ARGV[1] must be enter, renew, leave or expired')
end
redis.call('HSET', KEYS[1], owner, string.format('%d', now_ms() + lease) .. ' ' .. id)
-- The key outlives a lapsed entry by far: a taker must still find the
-- session of a holder that stopped (its entry is the only trace of it).
redis.call('PEXPIRE', KEYS[1], 86400000)
return 1
