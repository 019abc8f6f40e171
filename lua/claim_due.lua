-- claim_due.lua — layer 5: claim payment deadlines that are due, with a lease.
--
-- Due entries are not popped: their score moves forward to now + lease (a
-- visibility timeout). The claimer releases them (release.lua removes the
-- entry); if it crashes first, they become due again when the lease ends and
-- another claim takes them — nothing is lost between "taken" and "done".
--
-- KEYS[1]  seckill:{V}:timeouts   zset order id -> payment deadline (Unix ms)
-- ARGV[1]  lease in milliseconds
-- ARGV[2]  most entries to claim
--
-- Returns {now_ms, {order id, deadline ms, order id, deadline ms, ...}} with
-- the deadlines as they were before the claim (Redis server clock).
--
-- Safe to run twice: the replay finds the first run's entries leased (not
-- due) and returns none of them; the claimer whose reply was lost never
-- saw them, so they come back to the next claim after their lease — late,
-- not lost, and their release is idempotent (release.lua).

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'WITHSCORES', 'LIMIT', 0, tonumber(ARGV[2]))
local lease_until = now + tonumber(ARGV[1])
for i = 1, #due, 2 do
  redis.call('ZADD', KEYS[1], lease_until, due[i])
end
return {now, due}
