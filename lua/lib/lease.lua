-- lib/lease.lua — layer 3 lease locks (DESIGN.md §5), prepended by the binary
-- to lua/lock_acquire.lua, lua/lock_renew.lua, lua/lock_release.lua and
-- lua/finish.lua (to run one of them by hand, prepend this file too).
--
-- All of a voucher's locks live in one hash, seckill:{V}:locks:
--   field  <user id>
--   value  "<expires_ms> <reentry count> <owner token>"
-- A lock whose expiry (Redis's clock) has passed is free, whatever the hash
-- still says. One hash read and at most one write and one delete per batch,
-- instead of a key and two or three commands per user. The key itself lives
-- at least as long as the longest lease in it, so its expiry never cuts a
-- lease short; it goes when every lease in it has run out.
--
-- One more field, `encoding`, holds a value longer than Redis's
-- hash-max-listpack-value (64 by default): it keeps the hash in the
-- hashtable encoding from its first write. A small hash is a listpack,
-- searched end to end for every field, and a batch's locks come and go
-- together: with a listpack, a batch of 256 cost ~6x more Redis time.

local function lease_now()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Redis's unpack has a limit of its own: commands are sent in slices.
local SLICE = 1000

-- The locks of `users` as { [user] = {exp, count, owner} or false }.
local function lease_read(key, users)
  local state = {}
  for j = 1, #users, SLICE do
    local last = math.min(j + SLICE - 1, #users)
    local vals = redis.call('HMGET', key, unpack(users, j, last))
    for k = j, last do
      local v = vals[k - j + 1]
      local lock = false
      if v then
        local exp, count, owner = string.match(v, '^(%d+) (%d+) (.*)$')
        if exp then lock = { tonumber(exp), tonumber(count), owner } end
      end
      state[users[k]] = lock
    end
  end
  return state
end

-- Whether `owner` holds `lock` at `now`.
local function lease_held(lock, owner, now)
  return lock and lock[3] == owner and lock[1] > now
end

local ENCODING_FIELD = 'encoding'
local ENCODING_VALUE = 'this field keeps the hash in the hashtable encoding'
  .. ' (a listpack is searched end to end for every field): lua/lib/lease.lua'
  .. string.rep('.', 64)

-- Writes the locks of `changed` (user -> true) as they are in `state`:
-- a lock set to false is deleted. `lease_ms` (when set) is how long the
-- hash must live at least.
local function lease_write(key, state, changed, lease_ms)
  local set, del = {}, {}
  for user in pairs(changed) do
    local lock = state[user]
    if lock then
      set[#set + 1] = user
      set[#set + 1] = string.format('%d %d %s', lock[1], lock[2], lock[3])
    else
      del[#del + 1] = user
    end
  end
  if #set > 0 and redis.call('HEXISTS', key, ENCODING_FIELD) == 0 then
    redis.call('HSET', key, ENCODING_FIELD, ENCODING_VALUE)
  end
  for j = 1, #set, 2 * SLICE do
    redis.call('HSET', key, unpack(set, j, math.min(j + 2 * SLICE - 1, #set)))
  end
  for j = 1, #del, SLICE do
    redis.call('HDEL', key, unpack(del, j, math.min(j + SLICE - 1, #del)))
  end
  if lease_ms and #set > 0 and redis.call('PTTL', key) < lease_ms then
    redis.call('PEXPIRE', key, lease_ms)
  end
end

-- The arguments of the scripts that take (owner, lease, users...) over
-- KEYS[1]: owner, lease, the users, Redis's time and their locks.
local function lease_args()
  local users = {}
  for i = 3, #ARGV do users[#users + 1] = ARGV[i] end
  return ARGV[1], tonumber(ARGV[2]), users, lease_now(), lease_read(KEYS[1], users)
end

-- Gives back one reentry of `owner` on each of `users` (a user listed twice
-- gives back two); returns how many were held. A lock whose count reaches 0
-- is deleted, as is the owner's own expired one; a lock held by someone
-- else is left alone (never release by name alone).
local function lease_release(key, owner, users)
  if #users == 0 then return 0 end
  local now = lease_now()
  local state = lease_read(key, users)
  local changed, released = {}, 0
  for _, user in ipairs(users) do
    local lock = state[user]
    if lease_held(lock, owner, now) then
      released = released + 1
      lock[2] = lock[2] - 1
      if lock[2] <= 0 then state[user] = false end
      changed[user] = true
    elseif lock and lock[3] == owner then
      state[user] = false
      changed[user] = true
    end
  end
  lease_write(key, state, changed, nil)
  return released
end
