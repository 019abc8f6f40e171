-- finish.lua — layer 2/4: complete a persisted batch of one voucher, atomically.
--
-- Called by `seckill worker` after the batch's MySQL transaction committed.
-- Schedules the payment deadlines, moves refused messages to the dead-letter
-- stream, only then acknowledges the entries, and releases the batch's lease
-- locks (lua/lib/lease.lua, as lock_release.lua) in the same step: a crash before this script
-- leaves every entry pending, and its redelivery completes the same work
-- (deadlines are derived from the stored orders; a dead letter is written
-- only while its entry is still pending, so never twice).
--
-- KEYS[1]  seckill:{V}:orders     stream
-- KEYS[2]  seckill:{V}:timeouts   zset   order id -> payment deadline (ms)
-- KEYS[3]  seckill:{V}:dead       stream dead letters
-- KEYS[4]  seckill:{V}:locks      hash   the lease locks (lua/lib/lease.lua)
-- KEYS[5]  seckill:{V}:meta       hash   optional: its timeouts_digest
--                                        follows the deadlines added
--                                        (lua/lib/digest.lua), and its
--                                        `committed` counts the orders
--                                        inserted (below)
--
-- ARGV[1]  consumer group
-- ARGV[2]  lock owner token
-- ARGV[3]  D, the number of deadlines, then D pairs: order id, deadline ms
-- then     N, the number of dead letters, then N triples: entry id, reason, deliveries
-- then     U, the number of locks to release, then U user ids
-- then     C, the number of entry ids that follow whose orders MySQL holds
--          (this batch inserted them, or found them stored as these very
--          entries inserted them: by a delivery that died before
--          acknowledging them; a copy of an entry that finds its order
--          stored goes with the others), then those C ids
--          (the witness of MySQL's commits: each adds one to meta's
--          `committed` when its XACK succeeds, so an order is counted once
--          and a replay adds nothing; the gate guard finds a MySQL that
--          lost commits by it having fewer orders than that)
-- then     the other entry ids to acknowledge (dead-lettered ones, an
--          order's entry repeated in the batch, and a copy of an entry
--          whose order another entry inserted)
--
-- Returns the number of entries acknowledged.
--
-- Safe to run twice: the replay ZADDs the same deadlines, writes no dead
-- letter (its entry is no longer pending), acknowledges nothing (returns
-- 0; the worker does not use the count) and finds the locks released.
--
-- `lease_release` comes from lua/lib/lease.lua and `zadd_counted` from
-- lua/lib/digest.lua, which the binary prepends (to run this file by hand,
-- prepend them too).

local group, owner = ARGV[1], ARGV[2]
local i = 3
local deadlines = tonumber(ARGV[i]); i = i + 1
-- One ZADD for the batch (in slices: unpack has a limit of its own).
local scheduled = {}
for _ = 1, deadlines do
  scheduled[#scheduled + 1] = {ARGV[i], ARGV[i + 1]}
  i = i + 2
end
zadd_counted(KEYS[2], KEYS[5], 'timeouts_digest', scheduled)
local dead = tonumber(ARGV[i]); i = i + 1
for _ = 1, dead do
  local id, reason, deliveries = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  i = i + 3
  if #redis.call('XPENDING', KEYS[1], group, id, id, 1) > 0 then
    local fields = {'entry', id, 'reason', reason, 'deliveries', deliveries}
    local entry = redis.call('XRANGE', KEYS[1], id, id)
    if entry[1] then
      for _, v in ipairs(entry[1][2]) do fields[#fields + 1] = v end
    end
    redis.call('XADD', KEYS[3], '*', unpack(fields))
  end
end
local locked = tonumber(ARGV[i]); i = i + 1
local users = {}
for _ = 1, locked do
  users[#users + 1] = ARGV[i]
  i = i + 1
end
local inserted = tonumber(ARGV[i]); i = i + 1
local last_inserted = i + inserted - 1
local acked = 0
for j = i, last_inserted, SLICE do
  acked = acked + redis.call('XACK', KEYS[1], group, unpack(ARGV, j, math.min(j + SLICE - 1, last_inserted)))
end
if acked > 0 and KEYS[5] then
  redis.call('HINCRBY', KEYS[5], 'committed', acked)
end
for j = last_inserted + 1, #ARGV, SLICE do
  acked = acked + redis.call('XACK', KEYS[1], group, unpack(ARGV, j, math.min(j + SLICE - 1, #ARGV)))
end
lease_release(KEYS[4], owner, users)
return acked
