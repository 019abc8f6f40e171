-- node_lease.lua — lease a snowflake node id, so that no two live processes
-- (on any host) mint order ids with the same node id, and no holder of a
-- node id mints an id a former holder already minted.
--
-- Public contract: application servers that mint the order ids they pass to
-- lua/seckill.lua take part the same way `seckill` does (see
-- docs/src/concepts/order-ids.md). Both keys carry the hash tag {nodes}:
-- one Cluster slot.
--
-- KEYS[1]  seckill:{nodes}:lease:<N>  string  the holder's token, with a TTL
-- KEYS[2]  seckill:{nodes}:clock      hash    N -> the highest id time (Unix
--                                             ms) any holder of N may have used
--
-- ARGV[1]  "claim", "renew" or "release"
-- ARGV[2]  the holder's token (random, unique per process)
-- ARGV[3]  lease TTL in ms
-- ARGV[4]  N, the node id (0..1023)
-- ARGV[5]  the caller's id time now (Unix ms): its clock, or the time in its
--          newest id if that is ahead
--
-- Returns the node's floor, or -1:
--   claim    -1 if N is leased by another live holder; otherwise the lease
--            is taken and the floor F returned: mint only ids with a time
--            above F (a holder whose clock is behind a former holder's must
--            not repeat its ids). Records max(F, ARGV[5]) + TTL. A claim
--            of a lease the caller's token holds already (its claim resent:
--            the reply was lost) changes nothing and returns max(F,
--            ARGV[5]), the recorded time less the TTL, which is what the
--            first claim recorded from: no holder of N used a time above
--            F, and the caller has minted nothing yet. (A holder never
--            claims the node id it holds otherwise.) A holder claiming
--            again after a loss also stays above its own newest id: F is 0
--            if Redis lost this hash (a failover to an empty replica).
--   renew    -1 if the lease is no longer the caller's (it expired, and
--            maybe another process took it): stop minting with N at once.
--            Records max(recorded, ARGV[5] + TTL).
--   release  -1 if not the caller's; otherwise the lease is deleted and
--            ARGV[5] recorded: the time of the caller's next id, above every
--            id it minted (so claim-mint-release cycles, as `seckill buy`
--            runs them, do not push the floor ahead of the clock).
-- A holder mints no id with a time at or past what its last claim or
-- renewal recorded, and none once a TTL has passed since that call was sent.
--
-- Safe to run twice: a resent claim is answered as above (it was -1, as if
-- another process held N: the caller gave up a node id it held, or with
-- a pinned node id failed). A resent renew sets the same TTL from a moment
-- later and records the same time. A resent release finds the lease gone
-- and answers -1, writing nothing (the caller ignores that answer).

local ttl, now = tonumber(ARGV[3]), tonumber(ARGV[5])
local function recorded()
  return tonumber(redis.call('HGET', KEYS[2], ARGV[4]) or '0')
end
local function record(t)
  redis.call('HSET', KEYS[2], ARGV[4], string.format('%d', t))
end

local op = ARGV[1]
if op == 'claim' then
  if not redis.call('SET', KEYS[1], ARGV[2], 'NX', 'PX', ttl) then
    if redis.call('GET', KEYS[1]) == ARGV[2] then return math.max(recorded() - ttl, 0) end
    return -1
  end
  local floor = recorded()
  record(math.max(floor, now) + ttl)
  return floor
end
if redis.call('GET', KEYS[1]) ~= ARGV[2] then return -1 end
local floor = recorded()
if op == 'renew' then
  redis.call('PEXPIRE', KEYS[1], ttl)
  record(math.max(floor, now + ttl))
elseif op == 'release' then
  redis.call('DEL', KEYS[1])
  record(now)
else
  return redis.error_reply('ERR node_lease: unknown operation')
end
return floor
