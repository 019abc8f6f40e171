-- requeue.lua — move dead letters back into the order stream once their
-- cause is fixed (`seckill pending --voucher V --requeue`).
--
-- KEYS[1]  seckill:{V}:dead     stream dead letters
-- KEYS[2]  seckill:{V}:orders   stream the worker reads
-- ARGV[i]  dead-letter entry ids to requeue
--
-- Returns {requeued, skipped}: a dead letter that is not a well-formed order
-- of this voucher (user, order and voucher ids as lua/seckill.lua checks
-- them) cannot be requeued and stays where it is, as does an id that is not
-- in the dead-letter stream.
--
-- `valid_id` comes from lua/lib/valid_id.lua, which the binary prepends (to
-- run this file by hand, prepend it too).

local requeued, skipped = 0, 0
for _, id in ipairs(ARGV) do
  local e = redis.call('XRANGE', KEYS[1], id, id)
  local f = {}
  if e[1] then
    local kv = e[1][2]
    for j = 1, #kv, 2 do
      if f[kv[j]] == nil then f[kv[j]] = kv[j + 1] end
    end
  end
  if valid_id(f.user) and valid_id(f.order) and valid_id(f.voucher)
      and string.find(KEYS[2], '{' .. f.voucher .. '}', 1, true) then
    redis.call('XADD', KEYS[2], '*', 'user', f.user, 'order', f.order, 'voucher', f.voucher,
      'kind', f.kind or 'admit')
    redis.call('XDEL', KEYS[1], id)
    requeued = requeued + 1
  else
    skipped = skipped + 1
  end
end
return {requeued, skipped}
