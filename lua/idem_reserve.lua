-- idem_reserve.lua — the first step of a request with an idempotency key
-- (`seckill serve`'s Idempotency-Key, `seckill buy --idempotency-key`):
-- find the key's reservation, or take it. The reservation lives in the
-- key's own hash slot, so a resend finds it whatever user or voucher it
-- names (the admission's own record, KEYS[9] of lua/seckill.lua, lives in
-- the buyer's bucket's slot as seckill:{tag}:idem:<nonce>; the
-- reservation holds the nonce, and the caller names the record at the
-- gate it sends the admission to).
--
-- KEYS[1]  seckill:idem:{<scope>:<D>}  hash  D: SHA-256 of the key (hex);
--          scope: the API key's (first 16 hex digits of its SHA-256) or
--          "shared" (callers without an API key). Fields:
--            fingerprint  the request's, after parsing (who buys what)
--            state        pending | done
--            nonce        names the admission's record (KEYS[9] of
--                         seckill.lua: seckill:{tag}:idem:<nonce>)
--            at_ms        when the request was taken (Redis time); 0 when
--                         its taker failed and a resend may go on at once
--            status, body an answer stored once done (lua/idem_settle.lua)
--            code, reason, value  the admission's reply, when the admission
--                         script took the reservation itself (its
--                         KEYS[10], one Redis only) and recorded it here
-- ARGV[1]  the request's fingerprint (1 .. 128 characters)
-- ARGV[2]  a fresh nonce (1 .. 64 characters) for a new reservation
-- ARGV[3]  lifetime, ms, 1 .. 2592000000
--
-- Returns:
--   {0, nonce, 0}          taken now: the caller runs the request
--   {1, status, body}      done: the recorded answer, to replay
--   {2, nonce, age_ms}     pending: taken by an earlier request age_ms ago
--                          (its nonce, to look for its record)
--   {3, '', 0}             the key was used with another fingerprint
--   {4, nonce, code, reason, value}  the admission ran and its reply is
--                          recorded here (lua/seckill.lua's KEYS[10]): the
--                          answer to render again
--
-- Safe to run twice: a replay finds its own reservation pending.

local fingerprint, nonce, lifetime = ARGV[1], ARGV[2], tonumber(ARGV[3] or '')
if type(fingerprint) ~= 'string' or #fingerprint < 1 or #fingerprint > 128 then
  return redis.error_reply('ERR idem_reserve: the fingerprint is 1 .. 128 characters')
end
if type(nonce) ~= 'string' or #nonce < 1 or #nonce > 64 then
  return redis.error_reply('ERR idem_reserve: the nonce is 1 .. 64 characters')
end
if not lifetime or lifetime < 1 or lifetime > 2592000000 or lifetime ~= math.floor(lifetime) then
  return redis.error_reply('ERR idem_reserve: the lifetime is 1 .. 2592000000 ms')
end

local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local r = redis.call('HMGET', KEYS[1], 'fingerprint', 'state', 'nonce', 'at_ms', 'status', 'body',
  'code', 'reason', 'value')
if not r[1] then
  redis.call('HSET', KEYS[1], 'fingerprint', fingerprint, 'state', 'pending', 'nonce', nonce,
    'at_ms', now_ms)
  redis.call('PEXPIRE', KEYS[1], lifetime)
  return {0, nonce, 0}
end
if r[1] ~= fingerprint then return {3, '', 0} end
if r[2] == 'done' then return {1, tonumber(r[5]) or 0, r[6] or ''} end
if r[7] then return {4, r[3] or '', tonumber(r[7]), r[8] or '', r[9] or ''} end
return {2, r[3] or '', math.max(now_ms - (tonumber(r[4]) or 0), 0)}
