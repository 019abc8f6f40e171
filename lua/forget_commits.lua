-- forget_commits.lua — take a gap of lost commits off a gate's witness
-- (meta `committed`), only if the witness is still what the caller read.
--
-- MySQL lost commits that nothing kept names (their stream entries were
-- trimmed, their buyers dropped by the operator): reconcile takes the gap
-- off the witness, so the guard does not pause for it again. Two runs that
-- read the same gap (two operators dropping lost commits at once, a job
-- retried) would each take it off, leaving a witness that counts fewer
-- commits than MySQL holds and hides that many orders of the next loss.
-- The first takes it off; the others find the witness moved and leave it.
--
-- KEYS[1]  seckill:{V}:meta
-- ARGV[1]  the witness as read (meta `committed`; 0 when absent or below 0)
-- ARGV[2]  the gap to take off (at most the witness)
--
-- Each gap taken off adds one to meta's `forgotten`, so that
-- lua/raise_commits.lua, whose count of MySQL's orders may predate the
-- loss, does not put the gap back.
--
-- Returns the witness after, or -1 when it had moved since the read
-- (nothing taken off: the caller's next read sees what is left).
--
-- Run twice (a resend after a lost reply), the replay finds the witness
-- moved by the first run and takes nothing off again: the gap comes off once.

local read, gap = tonumber(ARGV[1]), tonumber(ARGV[2])
if not read or read < 0 or not gap or gap < 0 or gap > read then
  return redis.error_reply('ERR forget_commits.lua: ARGV[1] must be the witness read and ARGV[2] a gap within it')
end
local now = tonumber(redis.call('HGET', KEYS[1], 'committed') or '0') or 0
if now < 0 then now = 0 end
if now ~= read then return -1 end
redis.call('HINCRBY', KEYS[1], 'forgotten', 1)
return redis.call('HINCRBY', KEYS[1], 'committed', -gap)
