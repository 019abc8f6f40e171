-- transfer_give.lua — moving stock between buckets, step 2 of 3: land the
-- units of a transfer (lua/transfer_take.lua) in the receiver, once
-- (design/buckets.md). Internal to `seckill worker`'s mover and to
-- reconcile, not for application servers.
--
-- A bucket receiving units with fresh order ids (F > 0) serves its
-- waitlist with them first, exactly as a release does (lua/release.lua: in
-- order of arrival, each request whole or passed over, up to the mover's
-- bound, lua/serve_up_to.lua; a fresh order id per promotion, a `promote`
-- entry in the order stream and a `promoted` event whose released_order is
-- "0": the units came by transfer); what no waiting request fits joins its
-- stock. The mover passes no ids: its units land in the stock, and it
-- serves the bucket's line once every move to it is done (a give of 0
-- units, ARGV[2]). The pool receiving units only adds them.
--
-- KEYS[1]  the receiver's meta (the pool's: bucket 0's): fields paused,
--          mover_epoch, begin_ms; promotions and buyers_digest as a release keeps them;
--          served_last (a serve's, below)
-- KEYS[2]  the receiver's units: seckill:{V.b.s}:stock, or seckill:{V}:pool
-- KEYS[3]  the receiver's transfers received: seckill:{V.b.s}:received, or
--          seckill:{V}:pool_received; hash id -> "given" or "void"
-- a bucket only (all five, or none for the pool):
-- KEYS[4]  seckill:{V.b.s}:buyers     KEYS[7]  seckill:{V.b.s}:events
-- KEYS[5]  seckill:{V.b.s}:waitlist   KEYS[8]  seckill:{V.b.s}:waitlist_quantity
-- KEYS[6]  seckill:{V.b.s}:orders
--
-- ARGV[1]  transfer id (the one taken)
-- ARGV[2]  its units (what the take answered); 0 for a bucket:
--          a serve, with no take before it: the bucket serves its waitlist
--          from the stock it holds (the mover, after raising the bound of
--          lua/serve_up_to.lua); its id, above every serve id before it
--          of the same epoch, makes it run once (meta's served_last keeps
--          "<epoch> <id>" of the last: one at or below it, of that epoch,
--          answers "already given")
-- ARGV[3]  the mover's epoch (as for the take)
-- ARGV[4]  voucher id
-- ARGV[5]  F, then F fresh order ids for promotions (pass the units plus
--          the per-user limit, as a release does; 0 lands the units in the
--          stock and serves nobody: the mover serves after its moves)
--
-- Returns {code, reason, promoted}:
--   {0, "given", units}      landed now; the units of it that went to
--                            waiting requests (the rest joined the stock)
--   {1, "already given", 0}  landed before: nothing written (a replay)
--   {2, "void", 0}           called off before it arrived (transfer_void):
--                            nothing written, the giver takes them back
--   {3, "fenced", epoch}     the receiver has seen a later mover
--   {4, "paused", 0}         the receiver's gate is paused (being rebuilt),
--                            or on a server other than the one its state
--                            was last checked on (meta's run_id:
--                            lua/lib/server_checked.lua), not yet
--                            checked by the gate guard: the units stay in
--                            transit, give again later
--   {5, "not loaded", 0}     the receiver's gate is not loaded (meta has no
--                            begin_ms: not preloaded yet, or lost): nothing
--                            written; the units stay in transit
--
-- Safe to run twice: KEYS[3] remembers every transfer that landed, meta's
-- served_last the last serve.

local t, units, epoch, voucher = ARGV[1], tonumber(ARGV[2]), mover_epoch(ARGV[3]), ARGV[4]
if not valid_id(t) then return redis.error_reply('ERR transfer_give: bad transfer id') end
if not units or units < 0 or units ~= math.floor(units) or (units == 0 and #KEYS ~= 8) then
  return redis.error_reply('ERR transfer_give: the units must be 1 or more (0 only for a bucket)')
end
if not epoch then
  return redis.error_reply('ERR transfer_give: the epoch must be 1 or more')
end
if not valid_id(voucher) or not (string.find(KEYS[1], '{' .. voucher .. '}', 1, true)
    or string.find(KEYS[1], '{' .. voucher .. '.', 1, true)) then
  return redis.error_reply('ERR transfer_give: voucher id does not match the keys')
end
if #KEYS ~= 3 and #KEYS ~= 8 then
  return redis.error_reply('ERR transfer_give: pass 3 keys (the pool) or 8 (a bucket)')
end
local nfresh = tonumber(ARGV[5] or '0') or 0

if units > 0 then
  local prior = redis.call('HGET', KEYS[3], t)
  if prior == 'given' then return {1, 'already given', 0} end
  if prior then return {2, 'void', 0} end
end
local meta = redis.call('HMGET', KEYS[1], 'paused', 'mover_epoch', 'begin_ms', 'served_last')
local seen = epoch_seen(meta[2])
local refused = fenced(epoch, seen)
if refused then return refused end
if not meta[3] then return {5, 'not loaded', 0} end
if meta[1] == '1' or not server_checked(KEYS[1]) then return {4, 'paused', 0} end
-- A serve is remembered by meta's served_last, "<epoch> <id>" of the last
-- one, not by a field per serve: ids rise within one mover's lease (they
-- are its snowflake ids), and a mover that takes the lease over has a
-- higher epoch, so its first serve runs even if its clock lags.
local function at_or_below(a, b) return #a < #b or (#a == #b and a <= b) end
if units == 0 and meta[4] then
  local last_epoch, last = string.match(meta[4], '^(%d+) (%d+)$')
  if last_epoch and tonumber(last_epoch) == epoch and at_or_below(t, last) then
    return {1, 'already given', 0}
  end
end

if units == 0 then
  redis.call('HSET', KEYS[1], 'served_last', string.format('%d', epoch) .. ' ' .. t)
else
  redis.call('HSET', KEYS[3], t, 'given')
end
see_epoch(KEYS[1], epoch, seen)
if #KEYS == 3 then
  redis.call('INCRBY', KEYS[2], units)
  return {0, 'given', 0}
end
local now = redis.call('TIME')
local now_ms = tostring(tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000))
local fresh = {}
for i = 1, nfresh do fresh[i] = ARGV[5 + i] end
local pool = units + math.max(tonumber(redis.call('GET', KEYS[2]) or '0') or 0, 0)
local k = {meta = KEYS[1], buyers = KEYS[4], waitlist = KEYS[5], orders = KEYS[6],
  events = KEYS[7], wants = KEYS[8]}
local left, promoted = serve_waitlist(k, voucher, pool, fresh, function() return '0' end, now_ms)
redis.call('SET', KEYS[2], left)
return {0, 'given', promoted}
