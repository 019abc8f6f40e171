-- pause.lua — pause or reopen a voucher's gate (the worker's gate guard,
-- while the gate is rebuilt after Redis lost writes MySQL holds; reconcile
-- and preload reopen a gate they found or made consistent). A paused gate
-- answers every attempt {6, "paused", 0} and writes nothing.
--
-- KEYS[1]  seckill:{V}:meta     hash   field paused = 1 while paused
-- KEYS[2]  seckill:{V}:buyers   set
-- ARGV[1]  "pause" or "reopen"
-- ARGV[2]  how many orders MySQL holds for the voucher, read before this
--          call (every order's user is a buyer unless Redis lost writes):
--          pause: optional; given, the gate is paused only if it has fewer
--                 buyers than that (checked in the same step)
--          reopen: required; the gate reopens only if it has at least that
--                 many buyers
--
-- Returns -1 when the gate is not loaded (nothing to pause or reopen);
--   pause:  1 paused now, 2 it was paused already, 0 not paused (enough buyers)
--   reopen: 1 reopened, 2 it was not paused, 0 it stays paused (too few buyers)

if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
local paused = redis.call('HGET', KEYS[1], 'paused') == '1'
local orders = ARGV[2] and ARGV[2] ~= '' and tonumber(ARGV[2])
if ARGV[2] and ARGV[2] ~= '' and not orders then
  return redis.error_reply('ERR pause.lua: ARGV[2] must be an order count')
end
if ARGV[1] == 'pause' then
  if paused then return 2 end
  if orders and redis.call('SCARD', KEYS[2]) >= orders then return 0 end
  redis.call('HSET', KEYS[1], 'paused', '1')
  return 1
elseif ARGV[1] == 'reopen' then
  if not orders then return redis.error_reply('ERR pause.lua: reopen needs the order count') end
  if not paused then return 2 end
  if redis.call('SCARD', KEYS[2]) < orders then return 0 end
  redis.call('HDEL', KEYS[1], 'paused')
  return 1
end
return redis.error_reply('ERR pause.lua: ARGV[1] must be pause or reopen')
