-- digest_sync.lua — reconciliation: correct a digest in the gate's meta
-- (lua/lib/digest.lua) that has left its set behind (a set changed by a
-- tool that does not keep it, or a gate from a release without digests).
--
-- Called by `seckill reconcile` after it read the set in full: it read the
-- field before and after the set and they agreed, so no script changed the
-- set meanwhile (every one that does moves the field).
--
-- KEYS[1]  seckill:{V}:meta   hash
-- ARGV     triples: field, the value read ('' for absent), the set's digest
--
-- Each field is written only if it still holds the value read: a change
-- since means the set moved, and the next reconcile looks again. Returns
-- how many were written. Safe to run twice: the replay finds each field
-- holding the new value, not the one read, and writes nothing.

local written = 0
for i = 1, #ARGV, 3 do
  local field, seen, digest = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  if (redis.call('HGET', KEYS[1], field) or '') == seen and seen ~= digest then
    redis.call('HSET', KEYS[1], field, digest)
    written = written + 1
  end
end
return written
