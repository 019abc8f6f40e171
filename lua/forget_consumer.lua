-- forget_consumer.lua — delete a consumer from the worker group, but only
-- when it has no pending entries. Atomic, so no entry can be delivered to it
-- between the check and the delete (XGROUP DELCONSUMER would drop that
-- entry from the pending list, and nobody would ever redeliver it).
--
-- KEYS[1]  seckill:{V}:orders
-- ARGV[1]  consumer group
-- ARGV[2]  consumer name
--
-- Returns 1 when the consumer was deleted, 0 when it still has pending entries.
--
-- Safe to run twice: the replay finds nothing pending for the deleted
-- consumer and deletes it again (XGROUP DELCONSUMER of a missing consumer
-- is no error), returning 1.

if #redis.call('XPENDING', KEYS[1], ARGV[1], '-', '+', 1, ARGV[2]) > 0 then
  return 0
end
redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], ARGV[2])
return 1
