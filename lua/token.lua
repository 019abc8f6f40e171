-- token.lua — store a user's admission token for a voucher that requires
-- tokens (`seckill voucher add --require-token`). Public contract:
-- application servers call it after their own captcha or risk check, with a
-- token they minted from a CSPRNG (at least 128 bits; Redis Lua's
-- math.random is deterministic, so tokens are never minted here), and hand
-- the token to the user's client, which passes it to lua/seckill.lua as
-- ARGV[4]. A token is bound to one user and one voucher and stays valid for
-- repeated attempts until it expires; storing another replaces it.
--
-- KEYS[1]  seckill:{V}:token:<U>  string  the user's token, with a TTL
-- ARGV[1]  the token: 16 to 128 characters from [A-Za-z0-9_-]
-- ARGV[2]  time to live in ms (1 .. 86400000)
--
-- Returns 1. Bad arguments give an error reply starting with "ERR token:".
--
-- Safe to run twice: the replay stores the same token, its TTL counted from
-- the replay (a few ms more).

local token, ttl = ARGV[1], tonumber(ARGV[2])
if type(token) ~= 'string' or #token < 16 or #token > 128 or not string.match(token, '^[A-Za-z0-9_-]+$') then
  return redis.error_reply('ERR token: a token is 16 to 128 characters from [A-Za-z0-9_-]')
end
if not ttl or ttl < 1 or ttl > 86400000 or ttl ~= math.floor(ttl) then
  return redis.error_reply('ERR token: the time to live is 1 .. 86400000 ms')
end
redis.call('SET', KEYS[1], token, 'PX', ttl)
return 1
