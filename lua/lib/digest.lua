-- lib/digest.lua — set digests in the gate's meta, prepended by the binary to
-- the scripts of lua/ that change the buyers, released or timeouts sets,
-- named below (to run one of them by hand, prepend this file too).
-- Used by: finish.lua, reconcile.lua, release.lua, requeue.lua, timeouts.lua, transfer_give.lua
--
-- A set's digest (src/support/set_digest.rs) is the sum of its members'
-- hashes modulo 2^52, a member's hash the first 52 bits (13 hex digits) of
-- the SHA-1 of its decimal form: MySQL keeps the same digests of the orders
-- (seckill_voucher.users_digest, pending_digest, cancelled_digest), so
-- reconcile compares the two stores' sets by count and digest instead of
-- reading them. meta fields: buyers_digest, released_digest and
-- timeouts_digest (absent: the empty set's, 0). 2^52 keeps every sum exact
-- in a Lua number; written with %.0f, exact below 2^53.
-- lua/seckill.lua carries its own copy of the rule (application servers load
-- it alone).

local DIGEST_MODULUS = 4503599627370496

local function digest_hash(member)
  return tonumber(string.sub(redis.sha1hex(tostring(member)), 1, 13), 16)
end

-- Adds (sign 1) or takes out (sign -1) the hashes of `members` (a list) in
-- meta's `field`. Callers pass only the members their write did add or
-- remove (SADD/SREM/ZADD/ZREM said so), which makes a replay change nothing.
local function digest_move(meta, field, members, sign)
  if #members == 0 then return end
  local d = tonumber(redis.call('HGET', meta, field) or '0') or 0
  for i = 1, #members do d = (d + sign * digest_hash(members[i])) % DIGEST_MODULUS end
  redis.call('HSET', meta, field, string.format('%.0f', d))
end

-- ZADD of {member, score} pairs in `key`, one call per 2,000; the members
-- new to the set are added to meta's `field` (no `meta`: none is kept).
-- With `nx`, members already there keep their score. Returns how many were
-- new.
local function zadd_counted(key, meta, field, pairs, nx)
  -- A member given twice (a batch may carry one order twice) is new once.
  local added, seen = {}, {}
  for j = 1, #pairs, 2000 do
    local members = {}
    for p = j, math.min(j + 1999, #pairs) do members[#members + 1] = pairs[p][1] end
    local scores = redis.call('ZMSCORE', key, unpack(members))
    local scored = {}
    for m = 1, #members do
      local new = not scores[m] and not seen[members[m]]
      seen[members[m]] = true
      if new then added[#added + 1] = members[m] end
      if new or not nx then
        scored[#scored + 1] = pairs[j + m - 1][2]
        scored[#scored + 1] = members[m]
      end
    end
    if #scored > 0 then redis.call('ZADD', key, unpack(scored)) end
  end
  if meta then digest_move(meta, field, added, 1) end
  return #added
end
