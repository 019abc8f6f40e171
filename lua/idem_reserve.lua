-- idem_reserve.lua — the first step of a request with an idempotency key
-- (`seckill serve`'s Idempotency-Key, `seckill buy --idempotency-key`):
-- find the key's reservation, or take it. The reservation lives in the
-- key's own hash slot, so a resend finds it whatever user or voucher it
-- names (the admission's own record, KEYS[9] of lua/seckill.lua, lives in
-- the buyer's bucket's slot; the reservation names it).
--
-- KEYS[1]  seckill:idem:{<scope>:<D>}  hash  D: SHA-256 of the key (hex);
--          scope: the API key's (first 16 hex digits of its SHA-256) or
--          "shared" (callers without an API key). Fields:
--            fingerprint  the request's, after parsing (who buys what)
--            state        pending | done
--            record       the admission's record key (KEYS[9] of seckill.lua)
--            at_ms        when the request was taken (Redis time); 0 when
--                         its taker failed and a resend may go on at once
--            status, body the answer, once done
-- ARGV[1]  the request's fingerprint (1 .. 128 characters)
-- ARGV[2]  the record key for a new reservation
-- ARGV[3]  lifetime, ms, 1 .. 2592000000
--
-- Returns:
--   {0, record, 0}         taken now: the caller runs the request
--   {1, status, body}      done: the recorded answer, to replay
--   {2, record, age_ms}    pending: taken by an earlier request age_ms ago
--                          (its record key, to look for its outcome)
--   {3, '', 0}             the key was used with another fingerprint
--
-- Safe to run twice: a replay finds its own reservation pending.

local fingerprint, record, lifetime = ARGV[1], ARGV[2], tonumber(ARGV[3] or '')
if type(fingerprint) ~= 'string' or #fingerprint < 1 or #fingerprint > 128 then
  return redis.error_reply('ERR idem_reserve: the fingerprint is 1 .. 128 characters')
end
if type(record) ~= 'string' or record == '' then
  return redis.error_reply('ERR idem_reserve: a record key is needed')
end
if not lifetime or lifetime < 1 or lifetime > 2592000000 or lifetime ~= math.floor(lifetime) then
  return redis.error_reply('ERR idem_reserve: the lifetime is 1 .. 2592000000 ms')
end

local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local r = redis.call('HMGET', KEYS[1], 'fingerprint', 'state', 'record', 'at_ms', 'status', 'body')
if not r[1] then
  redis.call('HSET', KEYS[1], 'fingerprint', fingerprint, 'state', 'pending', 'record', record,
    'at_ms', now_ms)
  redis.call('PEXPIRE', KEYS[1], lifetime)
  return {0, record, 0}
end
if r[1] ~= fingerprint then return {3, '', 0} end
if r[2] == 'done' then return {1, tonumber(r[5]) or 0, r[6] or ''} end
return {2, r[3] or '', math.max(now_ms - (tonumber(r[4]) or 0), 0)}
