-- lib/waitlist.lua — order entries and serving the waitlist, prepended by the
-- binary to the scripts of lua/ named below (to run one of them by hand,
-- prepend this file too, after lua/lib/digest.lua).
-- Used by: reconcile.lua, release.lua, requeue.lua, transfer_give.lua

-- Appends an order entry to `stream`; the `quantity` field only above one
-- unit and the `ref` field (the client reference) only when there is one,
-- so other entries stay as every release wrote them.
local function append_order(stream, user, order, voucher, kind, quantity, ref)
  local entry = {'user', user, 'order', order, 'voucher', voucher, 'kind', kind}
  if quantity > 1 then
    entry[#entry + 1] = 'quantity'
    entry[#entry + 1] = tostring(quantity)
  end
  if ref and ref ~= '' then
    entry[#entry + 1] = 'ref'
    entry[#entry + 1] = ref
  end
  redis.call('XADD', stream, '*', unpack(entry))
end

-- Serves waiting requests from `pool` units, in order of arrival, each whole
-- or passed over (it keeps its place); at most 1,000 looked at, one fresh
-- order id of `fresh` per promotion. `k` names the keys: waitlist, buyers,
-- orders, events, meta, and wants (seckill:{V}:waitlist_quantity, optional:
-- every request wants 1 without it; its field ref:<user> is the waiting
-- request's client reference, which the order takes). A waiting user who holds an order
-- already is dropped from the list. `released_of(n)` is the released order
-- the n-th promotion's event names. Returns the units left in the pool and
-- the units promoted.
--
-- A voucher in buckets: while the mover's bound in meta is live
-- (lua/serve_up_to.lua), requests queued after it are not served here,
-- since an earlier one waits at another bucket for these units (the mover
-- moves them there), so units go first come, first served across buckets.
-- While its lent units are live, the pool less them serves (they are the
-- mover's, for earlier requests at other buckets); they stay in the units
-- returned.
local function serve_waitlist(k, voucher, pool, fresh, released_of, now_ms)
  local looked, used, at, promoted = 0, 0, 0, 0
  local admitted = {}
  local bound = redis.call('HMGET', k.meta, 'serve_up_to', 'serve_up_to_until', 'lent', 'lent_until')
  local up_to = nil
  if bound[1] and (tonumber(bound[2] or '0') or 0) > tonumber(now_ms) then
    up_to = tonumber(bound[1])
  end
  local kept = 0
  if bound[3] and (tonumber(bound[4] or '0') or 0) > tonumber(now_ms) then
    kept = math.min(math.max(tonumber(bound[3]) or 0, 0), math.max(pool, 0))
  end
  pool = pool - kept
  while pool > 0 and used < #fresh and looked < 1000 do
    local entry = redis.call('ZRANGE', k.waitlist, at, at, 'WITHSCORES')
    local head = entry[1]
    if not head then break end
    -- Scores rise along the list: every request from here on came later.
    if up_to and tonumber(entry[2]) > up_to then break end
    looked = looked + 1
    local wants, ref = 1, nil
    if k.wants then
      local kept = redis.call('HMGET', k.wants, head, 'ref:' .. head)
      wants, ref = math.max(tonumber(kept[1] or '1') or 1, 1), kept[2]
    end
    if redis.call('SISMEMBER', k.buyers, head) == 1 then
      redis.call('ZREM', k.waitlist, head)
      if k.wants then redis.call('HDEL', k.wants, head, 'ref:' .. head) end
    elseif wants <= pool then
      used = used + 1
      local order = fresh[used]
      redis.call('ZREM', k.waitlist, head)
      if k.wants then redis.call('HDEL', k.wants, head, 'ref:' .. head) end
      redis.call('SADD', k.buyers, head)
      admitted[#admitted + 1] = head
      append_order(k.orders, head, order, voucher, 'promote', wants, ref)
      redis.call('XADD', k.events, '*', 'type', 'promoted', 'user', head, 'order', order,
        'voucher', voucher, 'released_order', released_of(used),
        'quantity', tostring(wants), 'time_ms', now_ms,
        'waited_ms', string.format('%d', math.max(tonumber(now_ms) - math.floor(tonumber(entry[2]) / 1000), 0)))
      redis.call('HINCRBY', k.meta, 'promotions', 1)
      pool = pool - wants
      promoted = promoted + wants
    else
      -- Wants more than the pool holds: passed over, keeps its place.
      at = at + 1
    end
  end
  digest_move(k.meta, 'buyers_digest', admitted, 1)
  return pool + kept, promoted
end
