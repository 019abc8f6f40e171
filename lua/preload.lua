-- preload.lua — publish one voucher's gate state in a single atomic step.
--
-- Called by `seckill preload` (and reconcile's rebuild) after it has read
-- MySQL and staged the buyers set; not meant for application servers.
--
-- KEYS[1]  seckill:{V}:meta            hash   written: total, begin_ms, end_ms, pay_timeout_ms,
--                                             user_rate, require_token, policy_version,
--                                             per_user_limit, waitlist_limit, published_run,
--                                             run_id (this server's, lua/lib/server_checked.lua)
-- KEYS[2]  seckill:{V}:stock           string set to ARGV[5]
-- KEYS[3]  seckill:{V}:buyers          set    replaced by KEYS[4] (or emptied when KEYS[4] is absent)
-- KEYS[4]  seckill:{V}:buyers:staging:<run>  set  the rebuilt buyers, consumed
-- KEYS[5]  seckill:{V}:orders          stream only read: its last entry id
-- KEYS[6]  seckill:{V}:released        set    replaced by KEYS[7] (or emptied)
-- KEYS[7]  seckill:{V}:released:staging:<run> set  cancelled orders in MySQL, consumed:
--                                       the stock published here already
--                                       counts their units, so nothing may
--                                       give them back a second time
-- KEYS[8]  seckill:{V}:holds           hash   only read (optional): while a worker
--                                       holds the gate (a batch in hand that
--                                       Redis lost, lua/pause.lua), the gate is
--                                       published paused: this image misses
--                                       that batch
-- KEYS[9]  seckill:{V}:rate            hash   optional (then KEYS[8] too): its
--                                       expiry is moved to ARGV[3] + 1000, so a
--                                       sale extended (or shortened) keeps its
--                                       users' rate windows until its new end
--                                       (lua/seckill.lua sets it only on the
--                                       key's creation)
--
-- KEYS[10] seckill:{V}:pool            string optional, bucket 0 of a voucher in
--                                       buckets only: set to ARGV[23],
--                                       the units given to no bucket
--
-- `hold_is_live` comes from lua/lib/holds.lua, which the binary prepends.
--
-- ARGV[1..4]  total, begin_ms, end_ms, pay_timeout_ms
-- ARGV[5]     stock to publish
-- ARGV[6..9] the gate's witness, read before MySQL was: the orders stream's
--            last entry id ('' if none), the gate stock ('' if none), the
--            buyers count and the released count. The same four values as
--            lua/reconcile.lua checks (src/gate/witness.rs): an admission,
--            promotion, release or repair changes at least one of them.
-- ARGV[10]   user_rate (attempts per user per second, 0: no limit)
-- ARGV[11]   require_token (1 or 0)
-- ARGV[12]   the run tag: the <run> of KEYS[4] and KEYS[7], unique per
--            publish; recorded in meta's published_run when published
-- ARGV[13]   how many members the caller staged in KEYS[4]
-- ARGV[14]   how many members the caller staged in KEYS[7]
-- ARGV[15]   optional: the version of the policy in ARGV[10..11], MySQL's
--            policy_version (decimal). Given, as in lua/policy.lua: when
--            meta holds a greater policy_version (a `voucher update`
--            published since MySQL was read), meta's policy is kept;
--            otherwise ARGV[10..11] are written and the version recorded.
--            Absent or empty: ARGV[10..11] are written and meta's
--            policy_version is removed.
-- ARGV[16]   optional: per_user_limit, written with ARGV[10..11]
-- ARGV[17]   optional, with ARGV[16]: waitlist_limit, '' for no
--            cap (meta's field is removed)
-- ARGV[18..19] optional, with ARGV[16..17]: the digests
--            (lua/lib/digest.lua) of the members staged in KEYS[4] and
--            KEYS[7], written to meta's buyers_digest and released_digest
--            with the sets; absent, both fields are removed (a digest of
--            the sets replaced would be wrong)
-- ARGV[20..22] optional, with ARGV[18..19]: the gate's bucket,
--            the voucher's bucket count and (bucket 0 only, '' for the
--            others) every bucket's tag, space-separated: meta's bucket,
--            buckets and bucket_tags, which lua/seckill.lua routes by;
--            absent, the three fields are removed (a voucher of one gate)
-- ARGV[23]   with KEYS[10]: the pool's units
--
-- Returns 1 when published (or when this run had published already),
-- 0 when refused: nothing is written then and the staging sets are dropped.
-- Refused when the voucher moved since it was read, or when a staging set
-- does not hold what was staged (it expired, or it was consumed by this
-- run's publish and another publish has run since).
--
-- Safe to run twice: a client resends this call when its reply was lost,
-- after the first run consumed the staging sets and (for a gate that was
-- consistent) left the witness as it was; replacing the buyers with the
-- missing staging set would then empty them. published_run = ARGV[12]
-- recognises the replay, which writes nothing and answers 1 like the
-- first run.

local run = ARGV[12]
if not run or run == '' or not tonumber(ARGV[13]) or not tonumber(ARGV[14]) then
  return redis.error_reply('ERR preload.lua: ARGV[12..14] must be the run tag and the staged counts')
end
local version = ARGV[15]
if version == '' then version = nil end
if version and (not string.match(version, '^%d+$') or #version > 19) then
  return redis.error_reply('ERR preload.lua: ARGV[15] must be a decimal policy version')
end
if ARGV[20] and (not string.match(ARGV[20], '^%d+$') or not string.match(ARGV[21] or '', '^[1-9]%d*$')) then
  return redis.error_reply('ERR preload.lua: ARGV[20..21] must be the bucket and the bucket count')
end
if KEYS[10] and not string.match(ARGV[23] or '', '^%d+$') then
  return redis.error_reply('ERR preload.lua: ARGV[23] must be the pool\'s units')
end
if KEYS[9] and not tonumber(ARGV[3]) then
  return redis.error_reply('ERR preload.lua: ARGV[3] must be the end in Unix ms')
end
if redis.call('HGET', KEYS[1], 'published_run') == run then return 1 end
if redis.call('SCARD', KEYS[4]) ~= tonumber(ARGV[13])
    or redis.call('SCARD', KEYS[7]) ~= tonumber(ARGV[14]) then
  redis.call('UNLINK', KEYS[4], KEYS[7])
  return 0
end

local last = redis.call('XREVRANGE', KEYS[5], '+', '-', 'COUNT', 1)
local last_id = ''
if last[1] then last_id = last[1][1] end
local stock = redis.call('GET', KEYS[2]) or ''
local buyers = tostring(redis.call('SCARD', KEYS[3]))
local released = tostring(redis.call('SCARD', KEYS[6]))
if last_id ~= ARGV[6] or stock ~= ARGV[7] or buyers ~= ARGV[8] or released ~= ARGV[9] then
  redis.call('UNLINK', KEYS[4], KEYS[7])
  return 0
end

local fields = {'total', ARGV[1], 'begin_ms', ARGV[2], 'end_ms', ARGV[3],
  'pay_timeout_ms', ARGV[4], 'published_run', run}
-- The gate is checked against MySQL on this server now
-- (lua/lib/server_checked.lua).
local here = this_run_id()
if here then
  fields[#fields + 1] = 'run_id'
  fields[#fields + 1] = here
end
local publish_policy = true
if version then
  -- Compared as decimal strings: Lua numbers are exact only to 2^53.
  local held = redis.call('HGET', KEYS[1], 'policy_version')
  if held and string.match(held, '^%d+$') then
    held = string.gsub(held, '^0+(%d)', '%1')
    local mine = string.gsub(version, '^0+(%d)', '%1')
    publish_policy = not (#held > #mine or (#held == #mine and held > mine))
  end
end
if publish_policy then
  for _, f in ipairs({'user_rate', ARGV[10], 'require_token', ARGV[11]}) do
    fields[#fields + 1] = f
  end
  if ARGV[16] then
    fields[#fields + 1] = 'per_user_limit'
    fields[#fields + 1] = ARGV[16]
    if (ARGV[17] or '') == '' then
      redis.call('HDEL', KEYS[1], 'waitlist_limit')
    else
      fields[#fields + 1] = 'waitlist_limit'
      fields[#fields + 1] = ARGV[17]
    end
  end
  if version then
    fields[#fields + 1] = 'policy_version'
    fields[#fields + 1] = version
  else
    redis.call('HDEL', KEYS[1], 'policy_version')
  end
end
redis.call('HSET', KEYS[1], unpack(fields))
if KEYS[9] then redis.call('PEXPIREAT', KEYS[9], tonumber(ARGV[3]) + 1000) end
redis.call('SET', KEYS[2], ARGV[5])
if hold_is_live(KEYS[8]) then redis.call('HSET', KEYS[1], 'paused', '1') end
if ARGV[18] and ARGV[19] then
  redis.call('HSET', KEYS[1], 'buyers_digest', ARGV[18], 'released_digest', ARGV[19])
else
  redis.call('HDEL', KEYS[1], 'buyers_digest', 'released_digest')
end
if ARGV[20] then
  redis.call('HSET', KEYS[1], 'bucket', ARGV[20], 'buckets', ARGV[21])
  if (ARGV[22] or '') ~= '' then
    redis.call('HSET', KEYS[1], 'bucket_tags', ARGV[22])
  else
    redis.call('HDEL', KEYS[1], 'bucket_tags')
  end
else
  redis.call('HDEL', KEYS[1], 'bucket', 'buckets', 'bucket_tags')
end
if KEYS[10] then redis.call('SET', KEYS[10], ARGV[23]) end
for _, pair in ipairs({{KEYS[4], KEYS[3]}, {KEYS[7], KEYS[6]}}) do
  if redis.call('EXISTS', pair[1]) == 1 then
    -- The set replaced may hold millions: freed in the background
    -- (RENAME over it would free it here, holding Redis meanwhile).
    redis.call('UNLINK', pair[2])
    redis.call('RENAME', pair[1], pair[2])
    -- The staging set carried an expiry (in case its publisher died).
    redis.call('PERSIST', pair[2])
  else
    redis.call('UNLINK', pair[2])
  end
end
return 1
