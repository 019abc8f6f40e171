-- idem_settle.lua — the last step of a request with an idempotency key
-- (lua/idem_reserve.lua took its reservation): record its answer, or let
-- a resend go on at once.
--
-- KEYS[1]  seckill:idem:{<scope>:<D>}  the reservation
-- ARGV[1]  done | open
-- ARGV[2]  the nonce the request ran with (the reservation's; another
--          means the reservation expired and was taken by a later request)
-- ARGV[3]  done: the answer's status (100 .. 599)
-- ARGV[4]  done: the answer's body
--
-- done: records the answer if the reservation is still pending; returns
--   {1, status, body}, the answer recorded (this one, or an earlier
--   request's, which the caller answers instead), or {0, 0, ''} when the
--   reservation is gone (expired, or lost with Redis's last writes).
-- open: the request failed before it had an answer to record (its outcome
--   unknown, or nothing done): a resend need not wait for it. Returns
--   {0, 0, ''}.

local mode, nonce = ARGV[1], ARGV[2]
local r = redis.call('HMGET', KEYS[1], 'state', 'nonce', 'status', 'body')
if not r[1] or r[2] ~= nonce then return {0, 0, ''} end
if mode == 'open' then
  if r[1] == 'pending' then redis.call('HSET', KEYS[1], 'at_ms', 0) end
  return {0, 0, ''}
end
if mode ~= 'done' then return redis.error_reply('ERR idem_settle: the mode is done or open') end
if r[1] == 'done' then return {1, tonumber(r[3]) or 0, r[4] or ''} end
local status = tonumber(ARGV[3] or '')
if not status or status < 100 or status > 599 or type(ARGV[4]) ~= 'string' then
  return redis.error_reply('ERR idem_settle: a status 100 .. 599 and a body are needed')
end
redis.call('HSET', KEYS[1], 'state', 'done', 'status', status, 'body', ARGV[4])
return {1, status, ARGV[4]}
