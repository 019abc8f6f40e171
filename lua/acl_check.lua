-- acl_check.lua — which of a list of commands the calling user may run,
-- asked of Redis's ACL without running any of them (`seckill doctor`).
--
-- KEYS[1]  a key under the prefix (routes the call; nothing is read)
-- ARGV     the commands, each as its word count n followed by its n words
--          (command, sub-command, arguments; keys under the prefix)
--
-- Returns the 1-based positions (in the list) of the commands the user
-- may not run. Needs Redis 7 (redis.acl_check_cmd); before 7 the call
-- fails naming acl_check_cmd.
--
-- Writes nothing: safe to run any number of times.

local denied = {}
local i, position = 1, 0
while i <= #ARGV do
  local n = tonumber(ARGV[i])
  local words = {}
  for j = 1, n do words[j] = ARGV[i + j] end
  position = position + 1
  if not redis.acl_check_cmd(unpack(words)) then
    denied[#denied + 1] = position
  end
  i = i + n + 1
end
return denied
