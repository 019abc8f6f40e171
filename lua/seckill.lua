-- seckill.lua — layer 1 admission: one attempt by one user to buy k units
-- (one order, all or nothing; k = 1 unless asked).
--
-- Public contract: application servers in any language call this script with
-- EVALSHA (load it once with SCRIPT LOAD; on NOSCRIPT, SCRIPT LOAD again).
-- All keys carry the voucher's hash tag, so the script runs on one Redis
-- Cluster slot. With the default prefix `seckill` and voucher V (a voucher
-- split into N buckets has one gate per bucket, bucket b's keys under the
-- tag recorded in bucket 0's meta field bucket_tags, {V} for bucket 0; a
-- user belongs to bucket
--   first 8 bytes of SHA-1(decimal user id), big-endian, mod N
-- and is admitted only there, code 10):
--
-- KEYS[1]  seckill:{V}:meta      hash   total, begin_ms, end_ms, pay_timeout_ms;
--                                 an admission updates its buyers_digest
--                                 (lua/lib/digest.lua)
-- KEYS[2]  seckill:{V}:stock     string remaining units at the gate
-- KEYS[3]  seckill:{V}:buyers    set    user ids that hold a unit
-- KEYS[4]  seckill:{V}:waitlist  zset   user id -> first queued time (microseconds)
-- KEYS[5]  seckill:{V}:orders    stream the hand-off to `seckill worker`
-- KEYS[6]  seckill:{V}:token:<U> string the user's admission token (needed only
--                                 when the voucher requires tokens)
-- KEYS[7]  seckill:{V}:rate      hash   user -> recent attempts (needed only
--                                 when the voucher has a user rate)
-- KEYS[8]  seckill:{V}:waitlist_quantity  hash  user -> units wanted, for
--                                 waitlisted requests of more than one unit,
--                                 and ref:<user> -> the client reference
--                                 (ARGV[8]) of a waitlisted request that
--                                 has one (needed only with ARGV[5] > 1
--                                 or an ARGV[8])
-- KEYS[9]  seckill:{V}:idem:<K>  hash   optional: this request's outcome
--                                 record, for an idempotency key K chosen
--                                 by the caller (any text without braces,
--                                 unique per request); see "Idempotency"
--                                 below. Keys are positional: pass KEYS[6..8]
--                                 with it
-- KEYS[10] seckill:idem:{<scope>:<D>}  hash  optional, with KEYS[9]: the
--                                 key's reservation (lua/idem_reserve.lua),
--                                 taken in this same run and holding the
--                                 record instead of KEYS[9]; only where it
--                                 lives on the same node as the gate (one
--                                 Redis, not a Cluster: another slot is a
--                                 CROSSSLOT error there)
--
-- ARGV[1]  user id     decimal integer, 1 .. 9223372036854775807
-- ARGV[2]  order id    decimal integer, 1 .. 9223372036854775807, a snowflake id
--                      made by the caller (unique per attempt)
-- ARGV[3]  voucher id  decimal integer, the V of the keys (written into the stream entry)
-- ARGV[4]  token       the user's admission token, or empty / absent for none
-- ARGV[5]  quantity    optional: the units wanted, 1 .. the voucher's
--                      per-user limit (meta per_user_limit, 1 when absent);
--                      empty / absent for 1
-- ARGV[6]  lifetime    with KEYS[9]: how long the outcome record lives,
--                      ms, 1 .. 2592000000 (30 days)
-- ARGV[7]  fingerprint with KEYS[10]: the request's (1 .. 128 characters),
--                      as lua/idem_reserve.lua takes it
-- ARGV[8]  client reference  optional: the caller's own name for this
--                      request, 1 .. 64 printable ASCII characters (space
--                      to ~); empty / absent for none. Needs KEYS[8]. It
--                      goes with the order: the stream entry's `ref`
--                      field (the worker keeps it in seckill_order.
--                      client_reference), or, for a request that waits,
--                      KEYS[8]'s field ref:<user> until the request is
--                      served (then its order carries it) or leaves the
--                      line. A later attempt of a user still waiting
--                      keeps the reference it queued with (one admitted
--                      at once carries its own). Pass ARGV[6] and ARGV[7]
--                      (empty without KEYS[9] and KEYS[10]) before it
--
-- Callers written for KEYS[1..5] and ARGV[1..3] keep working while the
-- voucher has no policy; with one, they get an error reply naming the key
-- (as they do for a KEYS[6] or KEYS[7] that is not this user's/voucher's).
-- Returns a 3-element array {code, reason, value}; value is a bulk string
-- for code 0 (the order id as given: 64-bit ids do not survive Lua numbers)
-- and an integer for every other code (a reply read back from KEYS[9] has
-- a fourth element, 1: see "Idempotency"):
--   {0, "ok", order id}            admitted: unit taken, user recorded as buyer,
--                                  removed from the waitlist (where a released
--                                  unit would otherwise reach them twice),
--                                  order entry appended to the stream
--   {1, "already bought", 0}       the user already holds a unit of this voucher
--   {2, "sold out", position}      no unit left; the user is on the waitlist at
--                                  this 1-based position (queued once, ever).
--                                  Also the answer when a voucher in buckets
--                                  keeps this bucket's units for requests
--                                  that came earlier (meta serve_up_to_until,
--                                  set by the mover, is later than now and
--                                  requests wait here), whatever the
--                                  quantity asked (not code 9)
--   {2, "waiting for units", position}  a voucher in buckets: this bucket
--                                  holds fewer units than asked (but some)
--                                  and the voucher's other buckets may
--                                  hold them (meta units_free, published by
--                                  the mover, is at least the quantity, or
--                                  lapsed): the request waits on the
--                                  waitlist as for code 2 "sold out", and
--                                  the mover brings the units; also the
--                                  answer to a user waiting already (a
--                                  resend). A full waitlist: code 9
--   {3, "not started", begin_ms}   the sale window opens at begin_ms (Unix ms)
--   {4, "ended", end_ms}           the sale window closed at end_ms (Unix ms)
--   {5, "unknown voucher", 0}      the voucher was never preloaded (`seckill preload`)
--   {6, "paused", 0}               the gate is paused (meta field paused = 1)
--   {7, "rate limited", 0}         the user made meta's user_rate attempts in
--                                  the last second already
--   {8, "bad token", 0}            the voucher requires a token and ARGV[4] is
--                                  not the one issued for this user (missing,
--                                  wrong, expired, or another user's/voucher's)
--   {9, "not enough stock", left}  fewer units left than asked for (but
--                                  some): nothing written, never a partial
--                                  order; for a voucher in buckets,
--                                  only when the mover's last word is that
--                                  the whole voucher has fewer units free
--                                  than asked (meta units_free, live)
--   {10, "wrong bucket", bucket}  the voucher is split into buckets (meta
--                                  buckets > 1) and this user belongs to
--                                  another: nothing written; call again with
--                                  the keys of that bucket
--   {11, "key reserved", 0}      KEYS[10] exists already (an earlier
--                                  request took the idempotency key):
--                                  nothing written; go the two-step way
--                                  (lua/idem_reserve.lua, then this
--                                  script with the reservation's record)
-- Code 2 with position 0: sold out and the waitlist is full (meta
-- waitlist_limit requests wait): nothing written.
-- Bad arguments are an error reply starting with "ERR seckill:".
--
-- The rate limit is a sliding window, exact under any concurrency: an
-- attempt passes it only if fewer than user_rate attempts of this user
-- passed it in the 1,000,000 microseconds before it (Redis TIME); attempts
-- it refuses do not count. So no one-second span, wherever it starts, holds
-- more than user_rate attempts that went on to the later checks.
--
-- Guarantees: checks run in this order — voucher loaded, bucket, quantity (an error
-- reply), sale window (Redis server clock, never the caller's), paused,
-- token, rate limit, already a buyer, stock — and the writes
-- (DECRBY stock, SADD buyers, ZREM waitlist, XADD orders) come only after every
-- check passed, inside this one atomic script, so no unit is sold twice and
-- no user holds two. A user who bought is never waitlisted. Code 2 writes
-- only the waitlist (ZADD NX, and KEYS[8]'s want and reference of the
-- request queued); nothing is written for codes 3, 4, 5 and 6;
-- codes 7 and 8 only count themselves (meta fields rejected_rate_limited,
-- rejected_bad_token); an attempt that passes the rate limit is recorded in
-- KEYS[7], whatever comes of it (it stops counting a second later and is
-- dropped at the user's next passing attempt; KEYS[7] expires 1 s after
-- the sale).
--
-- Safe to run twice: a client resends an attempt whose reply it lost. The
-- replay of an admission answers {1, "already bought", 0} (with a user
-- rate of 1, {7, "rate limited", 0}, counted in rejected_rate_limited):
-- the user holds exactly one unit and one order entry, nothing is taken or
-- appended twice. A replayed sold-out attempt keeps the user's place (ZADD
-- NX); a replayed refusal counts itself once more.
--
-- Idempotency (KEYS[9], ARGV[6]): the script records its reply in KEYS[9]
-- in the same atomic run as the admission, and a later call with the same
-- KEYS[9] returns that reply again, unchanged, with a fourth element 1,
-- before any check (sale window, stock, rate limit) and writing nothing:
-- the answer to a resend is the first request's, byte for byte, whatever
-- happened since. The record holds the user, the quantity and the client
-- reference; a call with the same KEYS[9] for another user, quantity or
-- reference gets an error reply ("ERR seckill: idempotency key ...
-- another request") and nothing is written. Not
-- recorded, so that a resend runs again: error replies; code 3 (not
-- started), 6 (paused) and 7 (rate limited), whose callers are told to
-- try again later; code 5 (unknown voucher: it may be loaded in a
-- moment); code 10 (nothing happened: the caller routes again). A record lives ARGV[6] ms; Redis
-- keeps it as it keeps the admission (appendfsync): if Redis loses its
-- last writes, the record goes with the admission it described.
-- With KEYS[10] (one Redis only), the script also takes the key's
-- reservation: if it exists, code 11 and nothing else; if not, and the
-- reply is one a record keeps, the reply is recorded in the reservation
-- itself (fields code, reason, value, with fingerprint ARGV[7], state
-- pending and nonce: KEYS[9]'s name after "idem:"; lifetime ARGV[6])
-- and KEYS[9] is not written: the key is taken, the admission made and
-- its reply recorded in one atomic run and one key, and
-- lua/idem_reserve.lua answers a resend with that reply. A reply not
-- recorded leaves the key free.

local function valid_id(s)
  return type(s) == 'string' and string.match(s, '^[1-9][0-9]*$') ~= nil
    and (#s < 19 or (#s == 19 and s <= '9223372036854775807'))
end

local user, order, voucher = ARGV[1], ARGV[2], ARGV[3]
if not valid_id(user) then return redis.error_reply('ERR seckill: bad user id') end
if not valid_id(order) then return redis.error_reply('ERR seckill: bad order id') end
if not valid_id(voucher) then return redis.error_reply('ERR seckill: bad voucher id') end
-- The keys' tag is the voucher's, {V}, or one of its buckets', {V.b.s}.
if not (string.find(KEYS[1], '{' .. voucher .. '}', 1, true)
    or string.match(KEYS[1], '{' .. voucher .. '%.%d+%.%d+}')) then
  return redis.error_reply('ERR seckill: voucher id does not match the keys')
end

-- KEYS[1] is <prefix>:{V}:meta: the other keys are checked against it.
local base = string.sub(KEYS[1], 1, -5)
local wanted = ARGV[5]
if wanted == nil or wanted == '' then wanted = '1' end
local reference = ARGV[8]
if reference == '' then reference = nil end
if reference and (#reference > 64 or string.find(reference, '[^\32-\126]')) then
  return redis.error_reply('ERR seckill: ARGV[8], the client reference, is 1 .. 64 printable ASCII characters')
end

local record, lifetime = KEYS[9], nil
if record then
  if #record <= #base + 5 or string.sub(record, 1, #base + 5) ~= base .. 'idem:' then
    return redis.error_reply('ERR seckill: KEYS[9] is not an idem: key of this voucher')
  end
  lifetime = tonumber(ARGV[6] or '')
  if not lifetime or lifetime < 1 or lifetime > 2592000000 or lifetime ~= math.floor(lifetime) then
    return redis.error_reply('ERR seckill: ARGV[6], the idempotency record lifetime, is 1 .. 2592000000 ms')
  end
  local seen = redis.call('HMGET', record, 'code', 'reason', 'value', 'user', 'quantity', 'ref')
  if seen[1] then
    if seen[4] ~= user or seen[5] ~= wanted or (seen[6] or '') ~= (reference or '') then
      return redis.error_reply('ERR seckill: idempotency key KEYS[9] was used for another request (another user, quantity or client reference)')
    end
    local value = seen[3]
    -- An order id stays a string (64 bits do not survive Lua numbers).
    if seen[1] ~= '0' then value = tonumber(value) end
    return {tonumber(seen[1]), seen[2], value, 1}
  end
end
local reservation, fingerprint = KEYS[10], ARGV[7]
if reservation then
  if not record then
    return redis.error_reply('ERR seckill: KEYS[10], a reservation, needs KEYS[9], its record')
  end
  if type(fingerprint) ~= 'string' or #fingerprint < 1 or #fingerprint > 128 then
    return redis.error_reply('ERR seckill: ARGV[7], the fingerprint, is 1 .. 128 characters')
  end
  if redis.call('EXISTS', reservation) == 1 then return {11, 'key reserved', 0} end
end

local function admit()
  local meta = redis.call('HMGET', KEYS[1], 'begin_ms', 'end_ms', 'paused', 'user_rate',
    'require_token', 'per_user_limit', 'waitlist_limit', 'bucket', 'buckets', 'serve_up_to_until',
    'units_free', 'units_free_until', 'lent', 'lent_until')
  local stock = redis.call('GET', KEYS[2])
  if not meta[1] or not meta[2] or not stock then
    return {5, 'unknown voucher', 0}
  end

  -- A voucher in buckets: each user belongs to one, whatever the caller
  -- routed, or one user could buy once in every bucket.
  local buckets = tonumber(meta[9] or '1') or 1
  if buckets > 1 then
    -- The first 8 bytes (16 hex digits) mod N, as two 32-bit halves: every
    -- step stays far below 2^53, so exact in Lua's doubles (and twice as
    -- fast as a digit at a time).
    local hex = redis.sha1hex(user)
    local high, low = tonumber(string.sub(hex, 1, 8), 16), tonumber(string.sub(hex, 9, 16), 16)
    local mine = ((high % buckets) * (4294967296 % buckets) + low % buckets) % buckets
    if mine ~= (tonumber(meta[8] or '0') or 0) then return {10, 'wrong bucket', mine} end
  end

  local limit = math.max(tonumber(meta[6] or '1') or 1, 1)
  if not string.match(wanted, '^[1-9][0-9]*$') or #wanted > 6 or tonumber(wanted) > limit then
    return redis.error_reply('ERR seckill: quantity must be between 1 and ' .. limit .. ' (the per-user limit)')
  end
  local quantity = tonumber(wanted)
  if quantity > 1 and not KEYS[8] then
    return redis.error_reply('ERR seckill: a quantity above 1 needs KEYS[8]')
  end
  if reference and not KEYS[8] then
    return redis.error_reply('ERR seckill: a client reference (ARGV[8]) needs KEYS[8]')
  end
  if KEYS[8] and KEYS[8] ~= string.sub(KEYS[1], 1, -5) .. 'waitlist_quantity' then
    return redis.error_reply('ERR seckill: KEYS[8] is not the waitlist_quantity key of this voucher')
  end

  local now = redis.call('TIME')
  local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
  local now_us = tonumber(now[1]) * 1000000 + tonumber(now[2])
  if now_ms < tonumber(meta[1]) then return {3, 'not started', tonumber(meta[1])} end
  if now_ms >= tonumber(meta[2]) then return {4, 'ended', tonumber(meta[2])} end
  if meta[3] == '1' then return {6, 'paused', 0} end

  -- The policy keys must be this voucher's and this user's (see base), or a
  -- caller's slip would check one user's token for another.

  if meta[5] == '1' then
    if not KEYS[6] then return redis.error_reply('ERR seckill: tokens are required: pass KEYS[6]') end
    if KEYS[6] ~= base .. 'token:' .. user then
      return redis.error_reply('ERR seckill: KEYS[6] is not the token key of this user and voucher')
    end
    local token = ARGV[4] or ''
    if token == '' or redis.call('GET', KEYS[6]) ~= token then
      redis.call('HINCRBY', KEYS[1], 'rejected_bad_token', 1)
      return {8, 'bad token', 0}
    end
  end

  local rate = tonumber(meta[4] or '0') or 0
  if rate > 0 then
    if not KEYS[7] then return redis.error_reply('ERR seckill: a user rate is set: pass KEYS[7]') end
    if KEYS[7] ~= base .. 'rate' then
      return redis.error_reply('ERR seckill: KEYS[7] is not the rate key of this voucher')
    end
    -- Per user, the passing attempts of the last second, oldest first, as
    -- decimal microseconds (Redis TIME: 16 digits from 2001 to 2286)
    -- separated by one space, in one hash per voucher (no key made per
    -- user). A user's first attempt, the common case in a sale, is one
    -- HSETNX; a later one reads the list.
    local now_text = string.format('%d', now_us)
    if redis.call('HSETNX', KEYS[7], user, now_text) == 1 then
      if redis.call('PTTL', KEYS[7]) < 0 then
        -- Nothing is checked against it once the sale has ended.
        redis.call('PEXPIREAT', KEYS[7], tonumber(meta[2]) + 1000)
      end
    else
      local list = redis.call('HGET', KEYS[7], user) or ''
      local since = now_us - 1000000
      -- Refused when the rate-th newest recorded attempt is inside the window
      -- (then rate attempts passed in the last second): one look at a fixed
      -- place, so a refusal costs the same however long the list is.
      local at = #list - 17 * rate + 2
      if at >= 1 and (tonumber(string.sub(list, at, at + 15)) or 0) > since then
        redis.call('HINCRBY', KEYS[1], 'rejected_rate_limited', 1)
        return {7, 'rate limited', 0}
      end
      local recent, n = {}, 0
      for t in string.gmatch(list, '%d+') do
        if tonumber(t) > since then
          n = n + 1
          recent[n] = t
        end
      end
      recent[n + 1] = now_text
      redis.call('HSET', KEYS[7], user, table.concat(recent, ' '))
    end
  end

  if redis.call('SISMEMBER', KEYS[3], user) == 1 then
    return {1, 'already bought', 0}
  end

  local left = tonumber(stock)
  -- A voucher in buckets: the units the mover's round takes from here to
  -- earlier requests at other buckets (meta lent, live until lent_until,
  -- lua/serve_up_to.lua) are not for sale here.
  if meta[13] and (tonumber(meta[14] or '') or 0) > now_ms then
    left = left - math.min(math.max(tonumber(meta[13]) or 0, 0), math.max(left, 0))
  end
  -- A voucher in buckets: while the mover's bound is live (lua/serve_up_to.lua)
  -- and requests wait here, this bucket's units are kept for them and for an
  -- earlier request waiting at another bucket: a newcomer queues behind them.
  local held = left > 0 and meta[10] and (tonumber(meta[10]) or 0) > now_ms
    and redis.call('EXISTS', KEYS[4]) == 1
  -- A voucher in buckets whose bucket holds fewer units than asked (but some):
  -- while the voucher's other units may fill the request, it waits for the
  -- mover to bring them, not refused (design/buckets.md hole 5). The mover
  -- publishes the voucher's units no earlier request waits for (meta
  -- units_free, live until units_free_until, Unix ms); lapsed or absent, the
  -- request waits too.
  local elsewhere = false
  if left > 0 and left < quantity and buckets > 1 then
    local free = tonumber(meta[11] or '')
    local live = free and (tonumber(meta[12] or '') or 0) > now_ms
    elsewhere = not live or free >= quantity
  end
  local reason = 'sold out'
  if left > 0 and not held then reason = 'waiting for units' end
  if left <= 0 or held or elsewhere then
    -- Scores strictly increase, so the queue is first come, first served even
    -- when two users arrive within the same microsecond.
    local queued_us = tonumber(now[1]) * 1000000 + tonumber(now[2])
    if not redis.call('ZSCORE', KEYS[4], user) then
      -- A full waitlist: the losing path of a hot sale writes nothing.
      local cap = tonumber(meta[7] or '')
      if cap and redis.call('ZCARD', KEYS[4]) >= cap then
        -- Units here, but no room to wait for the rest: as without buckets.
        if reason ~= 'sold out' then return {9, 'not enough stock', left} end
        return {2, 'sold out', 0}
      end
      local last = redis.call('ZRANGE', KEYS[4], -1, -1, 'WITHSCORES')
      if last[2] and tonumber(last[2]) >= queued_us then queued_us = tonumber(last[2]) + 1 end
      redis.call('ZADD', KEYS[4], 'NX', queued_us, user)
      -- The request waits with what it asked for and its reference
      -- (queued once: a later attempt of a waiting user changes nothing).
      -- A want or reference left by an earlier request of this user (freed
      -- by a repair) goes.
      if KEYS[8] then
        local set, gone = {}, {}
        if quantity > 1 then
          set[#set + 1], set[#set + 2] = user, quantity
        else
          gone[#gone + 1] = user
        end
        if reference then
          set[#set + 1], set[#set + 2] = 'ref:' .. user, reference
        else
          gone[#gone + 1] = 'ref:' .. user
        end
        if #set > 0 then redis.call('HSET', KEYS[8], unpack(set)) end
        if #gone > 0 then redis.call('HDEL', KEYS[8], unpack(gone)) end
      end
    end
    return {2, reason, redis.call('ZRANK', KEYS[4], user) + 1}
  end
  if left < quantity then
    -- A voucher in buckets: a request that waits already keeps its place (a
    -- resend of one whose answer was lost, after the mover's count fell): it
    -- is not refused while it may still be served.
    local rank = buckets > 1 and redis.call('ZRANK', KEYS[4], user)
    if rank then return {2, 'waiting for units', rank + 1} end
    return {9, 'not enough stock', left}
  end

  redis.call('DECRBY', KEYS[2], quantity)
  redis.call('SADD', KEYS[3], user)
  -- The buyers' digest, which reconcile compares with MySQL's: the rule of
  -- lua/lib/digest.lua, written out here because application servers load
  -- this file alone.
  local digest = tonumber(redis.call('HGET', KEYS[1], 'buyers_digest') or '0') or 0
  digest = (digest + tonumber(string.sub(redis.sha1hex(user), 1, 13), 16)) % 4503599627370496
  redis.call('HSET', KEYS[1], 'buyers_digest', string.format('%.0f', digest))
  -- A user admitted after a unit came back must not also be promoted later.
  if redis.call('ZREM', KEYS[4], user) == 1 and KEYS[8] then
    redis.call('HDEL', KEYS[8], user, 'ref:' .. user)
  end
  -- Fields only when used, so entries without them stay as every release
  -- wrote them (lua/lib/waitlist.lua's append_order, written out here
  -- because application servers load this file alone).
  local entry = {'user', user, 'order', order, 'voucher', voucher, 'kind', 'admit'}
  if quantity > 1 then
    entry[#entry + 1] = 'quantity'
    entry[#entry + 1] = wanted
  end
  if reference then
    entry[#entry + 1] = 'ref'
    entry[#entry + 1] = reference
  end
  redis.call('XADD', KEYS[5], '*', unpack(entry))
  return {0, 'ok', order}
end

local reply = admit()
-- Codes 3, 6 and 7 say "try again later", 5 "not loaded yet", 10 "route
-- again": a resend must run, so they are not recorded (src/gate/
-- admission.rs, Admission::kept_for_a_key, keeps the others).
local unrecorded = {[3] = true, [5] = true, [6] = true, [7] = true, [10] = true}
if record and reply.err == nil and not unrecorded[reply[1]] then
  if reservation then
    redis.call('HSET', reservation, 'fingerprint', fingerprint, 'state', 'pending',
      'nonce', string.sub(record, #base + 6), 'code', reply[1], 'reason', reply[2],
      'value', reply[3])
    redis.call('PEXPIRE', reservation, lifetime)
  else
    redis.call('HSET', record, 'code', reply[1], 'reason', reply[2], 'value', reply[3],
      'user', user, 'quantity', wanted, 'ref', reference or '')
    redis.call('PEXPIRE', record, lifetime)
  end
end
return reply
