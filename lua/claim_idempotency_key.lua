-- claim_idempotency_key.lua: pin an idempotency key to the first SKU it is
-- used with, and tell the caller when a claim that looks new cannot be
-- trusted to be new.
--
-- KEYS[1]  {q}idemclaim:<hash>   the claim (in the partition of the key's hash)
-- KEYS[2]  {q}idemclaims         the partition's marker: until when (ms) a claim that looks
--                                new must be checked against the ledger (0: never). It has
--                                no TTL, so it is lost exactly when the claims are.
-- ARGV[1]  sku   ARGV[2] claim TTL seconds
-- ARGV[3]  "1" when the caller has checked the ledger (take the claim whatever the marker)
-- ARGV[4]  the marker's value when the caller has worked it out ("" otherwise)
--
-- Returns {'OK'} (claimed now, or claimed before for this SKU), {'REUSED', sku}
-- (claimed for another SKU), {'MARK'} (the marker is missing: Redis lost this
-- partition's claims or never had any; the caller works out until when keys
-- the ledger knows may have been used, and calls again with ARGV[4]), or
-- {'CHECK'} (no claim, within the marker's window: the caller checks the
-- ledger and calls again with ARGV[3] = "1" and the SKU the ledger names).
--
-- Why one script: the marker check and the claim must be one step, or a
-- claim could be taken on a marker read before the claims were lost.

local prev = redis.call('GET', KEYS[1])
if prev then
  if prev == ARGV[1] then
    return { 'OK' }
  end
  return { 'REUSED', prev }
end
local until_ms = redis.call('GET', KEYS[2])
if not until_ms then
  if ARGV[4] == '' then
    return { 'MARK' }
  end
  redis.call('SET', KEYS[2], ARGV[4])
  until_ms = ARGV[4]
end
if ARGV[3] ~= '1' and now_ms() < tonumber(until_ms) then
  return { 'CHECK' }
end
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
return { 'OK' }
