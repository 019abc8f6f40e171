-- timeouts.lua — layer 5: add or drop payment deadlines, keeping the
-- timeouts set's digest (lua/lib/digest.lua) in the gate's meta.
--
-- Used by `seckill pay` (a paid order's deadline has nothing left to do),
-- the worker's MySQL sweep (deadlines Redis lost) and preload (the
-- deadlines of a rebuilt gate). An application server that drops a
-- deadline itself should call this too: a plain ZREM leaves the digest
-- behind, and reconcile then reads the voucher in full.
--
-- KEYS[1]  seckill:{V}:timeouts  zset   order id -> payment deadline (ms)
-- KEYS[2]  seckill:{V}:meta      hash   timeouts_digest
-- KEYS[3]  seckill:{V}:paid      set    order ids paid ('paid' only)
-- ARGV[1]  'add' (pairs: a deadline moves to the score given), 'add_nx'
--          (pairs: a deadline already there is left as it is, e.g. one
--          claimed with its lease), 'remove' (order ids) or 'paid' (order
--          ids, paid in MySQL: their deadlines removed and the ids kept in
--          KEYS[3], so a MySQL that loses the payment does not cancel the
--          order: the worker pays it again)
-- ARGV[2..] order id, deadline ms pairs ('add', 'add_nx') or order ids
--
-- Returns how many orders were added or removed.
--
-- Safe to run twice: the replay finds the deadlines there (or gone) and
-- changes neither the set nor its digest.

local mode = ARGV[1]
if mode == 'paid' and not KEYS[3] then
  return redis.error_reply("ERR timeouts.lua: 'paid' needs KEYS[3], the paid set")
end
if mode == 'remove' or mode == 'paid' then
  local gone = {}
  for i = 2, #ARGV do
    if redis.call('ZREM', KEYS[1], ARGV[i]) == 1 then gone[#gone + 1] = ARGV[i] end
    if mode == 'paid' then redis.call('SADD', KEYS[3], ARGV[i]) end
  end
  digest_move(KEYS[2], 'timeouts_digest', gone, -1)
  return #gone
end
if mode ~= 'add' and mode ~= 'add_nx' then
  return redis.error_reply("ERR timeouts.lua: ARGV[1] must be 'add', 'add_nx', 'remove' or 'paid'")
end
local pairs_ = {}
for i = 2, #ARGV - 1, 2 do
  if not tonumber(ARGV[i + 1]) then
    return redis.error_reply('ERR timeouts.lua: the deadline of order ' .. ARGV[i] .. ' must be a number')
  end
  pairs_[#pairs_ + 1] = {ARGV[i], ARGV[i + 1]}
end
return zadd_counted(KEYS[1], KEYS[2], 'timeouts_digest', pairs_, mode == 'add_nx')
