-- policy.lua — publish a voucher's admission policy at its gate (`seckill
-- voucher update`, and reconcile's repair of a gate whose policy differs
-- from MySQL). lua/seckill.lua reads it on every attempt, so it takes
-- effect at once, during a sale.
--
-- KEYS[1]  seckill:{V}:meta   hash   fields user_rate, require_token, policy_version,
--                                    per_user_limit, waitlist_limit
-- ARGV[1]  user_rate: at most this many attempts per user in any one second
--          (0: no limit)
-- ARGV[2]  require_token: 1 when admission needs a token, else 0
-- ARGV[3]  optional: the policy's version, MySQL's seckill_voucher.policy_version
--          read in the same row as ARGV[1..2] (decimal, 0 .. 2^63-1). Given,
--          the policy is published only if meta's policy_version is absent
--          or not greater, and is recorded in it: of two updates publishing
--          at once, the older one cannot land last. Absent or empty (a
--          caller older than the version): published unconditionally, and
--          meta's policy_version is removed, as the policy it named is gone.
-- ARGV[4]  optional: per_user_limit, the most units one purchase
--          may take (1 .. 100); absent: meta's stays as it is
-- ARGV[5]  optional, with ARGV[4]: waitlist_limit, the most
--          requests that may wait (decimal), or '' for no cap (removed)
--
-- Returns 1 when published, 0 when the voucher is not loaded at the gate
-- (nothing written: `seckill preload` publishes the policy with the gate),
-- 2 when refused because the gate holds a newer version (nothing written;
-- only with ARGV[3]).
--
-- Safe to run twice: the replay writes the same fields again (a version
-- equal to the one held is published).

local version = ARGV[3]
if version == '' then version = nil end
if version and (not string.match(version, '^%d+$') or #version > 19) then
  return redis.error_reply('ERR policy.lua: ARGV[3] must be a decimal version')
end
local limit, cap = ARGV[4], ARGV[5] or ''
if limit and (not string.match(limit, '^%d+$') or tonumber(limit) < 1) then
  return redis.error_reply('ERR policy.lua: ARGV[4] must be a per-user limit of 1 or more')
end
if limit and cap ~= '' and not string.match(cap or '', '^%d+$') then
  return redis.error_reply("ERR policy.lua: ARGV[5] must be a waitlist limit or ''")
end
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
-- The quantity fields, written with the rest of the policy.
local function write_limits()
  if not limit then return end
  redis.call('HSET', KEYS[1], 'per_user_limit', limit)
  if cap == '' then
    redis.call('HDEL', KEYS[1], 'waitlist_limit')
  else
    redis.call('HSET', KEYS[1], 'waitlist_limit', cap)
  end
end
if not version then
  redis.call('HSET', KEYS[1], 'user_rate', ARGV[1], 'require_token', ARGV[2])
  redis.call('HDEL', KEYS[1], 'policy_version')
  write_limits()
  return 1
end
-- Compared as decimal strings: Lua numbers are doubles, exact only to 2^53.
-- A held value that is not a version (written by hand) is overwritten.
local held = redis.call('HGET', KEYS[1], 'policy_version')
if held and string.match(held, '^%d+$') then
  held = string.gsub(held, '^0+(%d)', '%1')
  local mine = string.gsub(version, '^0+(%d)', '%1')
  if #held > #mine or (#held == #mine and held > mine) then return 2 end
end
redis.call('HSET', KEYS[1], 'user_rate', ARGV[1], 'require_token', ARGV[2],
  'policy_version', version)
write_limits()
return 1
