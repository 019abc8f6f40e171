-- lib/lease.lua — layer 3 lease locks (docs/src/concepts/rules.md),
-- prepended by the binary to the scripts of lua/ named below (to run one of
-- them by hand, prepend this file too).
-- Used by: finish.lua, lock_acquire.lua, lock_release.lua, lock_renew.lua
--
-- All of a voucher's locks live in one hash, seckill:{V}:locks:
--   field  <user id>
--   value  "<expires_ms> <count> <owner token>", count: how many times the
--          owner's acquisition listed the user (lua/lock_acquire.lua), each
--          given back by one release
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
--
-- These run once per order of every batch: values are taken apart with
-- plain finds (no patterns, no tables per lock), and a batch's fresh locks
-- share one value string.

local function lease_now()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- ARGV[first..] as a table (the users of a batch).
local function lease_users(first)
  local users = {}
  for i = first, #ARGV do users[#users + 1] = ARGV[i] end
  return users
end

-- Redis's unpack has a limit of its own: commands are sent in slices.
local SLICE = 1000

-- The stored values of `users`' locks, in the same order (false: none).
local function lease_values(key, users)
  local vals = {}
  for j = 1, #users, SLICE do
    local got = redis.call('HMGET', key, unpack(users, j, math.min(j + SLICE - 1, #users)))
    for k = 1, #got do vals[#vals + 1] = got[k] end
  end
  return vals
end

-- When a stored lock expires (0 when the value is not a lock: free).
local function lease_expiry(v)
  local a = v and string.find(v, ' ', 1, true)
  return a and tonumber(string.sub(v, 1, a - 1)) or 0
end

-- `owner`'s count on a stored lock: nil when the lock is not
-- `owner`'s (or there is none), 0 when it is but its lease ran out.
-- `once` is lease_once(owner).
local function lease_count(v, owner, now, once)
  if not v then return nil end
  -- Held once (nearly always): "<digits>" then `once`. What precedes the
  -- owner in anyone else's value holds spaces, so it is no number.
  local n = #v - #once
  if n > 0 and string.sub(v, n + 1) == once then
    local e = tonumber(string.sub(v, 1, n))
    if e then return (e > now) and 1 or 0 end
  end
  local a = string.find(v, ' ', 1, true)
  local b = a and string.find(v, ' ', a + 1, true)
  if not b or string.sub(v, b + 1) ~= owner then return nil end
  if (tonumber(string.sub(v, 1, a - 1)) or 0) <= now then return 0 end
  return tonumber(string.sub(v, a + 1, b - 1)) or 0
end

-- The end of the value of a lock `owner` holds once.
local function lease_once(owner)
  return ' 1 ' .. owner
end

local ENCODING_FIELD = 'encoding'
local ENCODING_VALUE = 'this field keeps the hash in the hashtable encoding'
  .. ' (a listpack is searched end to end for every field): lua/lib/lease.lua'
  .. string.rep('.', 64)

-- Writes `set` (user, value, user, value...) and deletes `del` (users).
-- `lease_ms` (when set) is how long the hash must live at least.
local function lease_store(key, set, del, lease_ms)
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

-- Gives back one count of `owner` on each of `users` (a user listed twice
-- gives back two); returns how many were held. A lock whose count reaches 0
-- is deleted, as is the owner's own expired one; a lock held by someone
-- else is left alone (never release by name alone).
local function lease_release(key, owner, users)
  if #users == 0 then return 0 end
  local now, once = lease_now(), lease_once(owner)
  local vals = lease_values(key, users)
  local left, stored, released = {}, {}, 0
  for i, user in ipairs(users) do
    local c = left[user]
    if c == nil then
      c = lease_count(vals[i], owner, now, once)
      if c and c > 1 then stored[user] = vals[i] end
    end
    if c and c > 0 then
      released = released + 1
      c = c - 1
    end
    left[user] = c
  end
  local set, del = {}, {}
  for user, c in pairs(left) do
    if c == 0 then
      del[#del + 1] = user
    else
      set[#set + 1] = user
      set[#set + 1] = lease_expiry(stored[user]) .. ' ' .. c .. ' ' .. owner
    end
  end
  lease_store(key, set, del, nil)
  return released
end
