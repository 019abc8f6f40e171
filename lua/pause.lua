-- pause.lua — pause or reopen a voucher's gate (the worker's gate guard:
-- paused while the gate is rebuilt after Redis lost writes MySQL holds).
-- A paused gate answers every attempt {6, "paused", 0} and writes nothing.
--
-- KEYS[1]  seckill:{V}:meta     hash   field paused = 1 while paused
-- KEYS[2]  seckill:{V}:buyers   set
-- ARGV[1]  "pause" or "reopen"
-- ARGV[2]  (reopen) how many orders MySQL holds for the voucher, read
--          before this call: the gate reopens only if it has at least that
--          many buyers (every order's user is a buyer unless Redis lost
--          writes), checked in the same step as the reopening
--
-- Returns 1 when done, 0 when not: the gate is not loaded (nothing to
-- pause), or (reopen) it still has fewer buyers than MySQL has orders.

if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
if ARGV[1] == 'pause' then
  redis.call('HSET', KEYS[1], 'paused', '1')
  return 1
elseif ARGV[1] == 'reopen' then
  local orders = tonumber(ARGV[2])
  if not orders then return redis.error_reply('ERR pause.lua: reopen needs the order count') end
  if redis.call('SCARD', KEYS[2]) < orders then return 0 end
  redis.call('HDEL', KEYS[1], 'paused')
  return 1
end
return redis.error_reply('ERR pause.lua: ARGV[1] must be pause or reopen')
