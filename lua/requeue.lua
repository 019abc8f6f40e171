-- requeue.lua — put dead letters back into the order stream once their
-- cause is fixed (`seckill pending --voucher V --requeue`), without
-- bypassing the gate's accounting: an order in the stream must hold a unit
-- at the gate and its user must be a buyer.
--
-- KEYS[1]  seckill:{V}:dead      stream dead letters
-- KEYS[2]  seckill:{V}:orders    stream the worker reads
-- KEYS[3]  seckill:{V}:stock     string units left at the gate
-- KEYS[4]  seckill:{V}:buyers    set
-- KEYS[5]  seckill:{V}:waitlist  zset
-- KEYS[6]  seckill:{V}:requeued  hash   dead-letter id -> "<code> <order id>" of
--                                the letters requeued in the last day
-- KEYS[7]  seckill:{V}:waitlist_quantity  hash  (optional): the
--                                units a re-admitted user waited for, and
--                                the waiting request's reference (ref:<user>),
--                                go with the user's place on the waitlist
--                                (the requeued entry keeps the letter's ref)
-- KEYS[8]  seckill:{V}:meta      hash   (optional, with KEYS[7]): its
--                                buyers_digest follows a user re-admitted
--                                (lua/lib/digest.lua)
-- ARGV     triples: a dead-letter entry id, the order id to requeue it
--          under (its own, or a fresh one where its own collides in MySQL),
--          and 1 when the unit its admission took is known not to be backed
--          by MySQL (dead-lettered for "no stock in MySQL": the gate was
--          ahead of MySQL by that unit), else 0
--
-- Returns one code per triple:
--    1  requeued: its user is still a buyer, so the unit taken at its
--       admission is still held for it (never for a triple ending in 1)
--    2  re-admitted and requeued: the unit had been given back meanwhile
--       (`seckill reconcile` frees buyers without an order), or was never
--       backed, so one was taken at the gate (DECR stock, SADD buyers, ZREM
--       waitlist)
--    0  not requeued: its user is no buyer and the gate has fewer units left
--       than the order holds (its quantity, 1 when absent)
--   -1  not requeued: no such dead letter
--   -2  not requeued: not a well-formed order of this voucher
-- Requeued dead letters are deleted from KEYS[1] and recorded in KEYS[6]
-- (which lives a day after the last requeue); the rest stay.
--
-- Safe to run twice: a client resends this call when its reply was lost.
-- The replay finds the letters the first run requeued gone from KEYS[1];
-- KEYS[6] gives back the code the first run answered for that letter
-- under that order id (1 or 2), and nothing is taken or appended again.
-- A letter the first run kept is looked at afresh (the first run wrote
-- nothing for it).
--
-- `valid_id` comes from lua/lib/valid_id.lua and `append_order` from
-- lua/lib/waitlist.lua, which the binary prepends (to run this file by
-- hand, prepend them too).

-- A replay comes within seconds; a day keeps the record small and gone
-- long before anyone could mistake an old one for a replay.
local RECORD_MS = 86400000

local out, requeued = {}, false
for i = 1, #ARGV, 3 do
  local id, order, unbacked = ARGV[i], ARGV[i + 1], ARGV[i + 2] == '1'
  local e = redis.call('XRANGE', KEYS[1], id, id)
  local code
  if not e[1] then
    code = -1
    local done = redis.call('HGET', KEYS[6], id)
    if done then
      local sp = string.find(done, ' ', 1, true)
      -- Only under the same order id: a dead-letter stream made anew
      -- starts its ids again, and another letter may have had this one.
      if sp and string.sub(done, sp + 1) == order then
        code = tonumber(string.sub(done, 1, sp - 1))
      end
    end
  else
    local f = {}
    local kv = e[1][2]
    for j = 1, #kv, 2 do
      if f[kv[j]] == nil then f[kv[j]] = kv[j + 1] end
    end
    local kind = f.kind or 'admit'
    -- The order's units (an entry without a quantity holds 1), all or none.
    local units = tonumber(f.quantity or '1')
    if not (valid_id(f.user) and valid_id(order) and valid_id(f.voucher)
        and (string.find(KEYS[2], '{' .. f.voucher .. '}', 1, true)
          or string.match(KEYS[2], '{' .. f.voucher .. '%.%d+%.%d+}'))
        and (kind == 'admit' or kind == 'promote')
        and units and units >= 1 and units == math.floor(units)) then
      code = -2
    elseif not unbacked and redis.call('SISMEMBER', KEYS[4], f.user) == 1 then
      code = 1
    elseif tonumber(redis.call('GET', KEYS[3]) or '0') >= units then
      redis.call('DECRBY', KEYS[3], units)
      if redis.call('SADD', KEYS[4], f.user) == 1 and KEYS[8] then
        digest_move(KEYS[8], 'buyers_digest', {f.user}, 1)
      end
      redis.call('ZREM', KEYS[5], f.user)
      if KEYS[7] then redis.call('HDEL', KEYS[7], f.user, 'ref:' .. f.user) end
      code = 2
    else
      code = 0
    end
    if code > 0 then
      append_order(KEYS[2], f.user, order, f.voucher, kind, units, f.ref)
      redis.call('XDEL', KEYS[1], id)
      redis.call('HSET', KEYS[6], id, code .. ' ' .. order)
      requeued = true
    end
  end
  out[#out + 1] = code
end
if requeued then redis.call('PEXPIRE', KEYS[6], RECORD_MS) end
return out
