"""The atomic Redis scripts behind versions, admission, leases, the ledger and evaluation claims
(Redis >= 6.2 EVAL).

Time comes from Redis itself (TIME), so lease expiry does not depend on worker clocks.
"""

PUBLISH_VERSION = """
-- KEYS: policy_version, version_meta, version_publish_id.
-- ARGV: version, publish id (unique per publish call), then field/value pairs.
-- The id makes a retry idempotent: a publish whose reply a Redis restart lost, sent again,
-- finds its own id on the current version and is accepted without a second write.
local current = tonumber(redis.call('GET', KEYS[1]) or '-1')
local proposed = tonumber(ARGV[1])
if proposed == current and redis.call('GET', KEYS[3]) == ARGV[2] then
  return 1
end
if proposed <= current then
  return 0
end
redis.call('SET', KEYS[1], proposed)
redis.call('SET', KEYS[3], ARGV[2])
redis.call('DEL', KEYS[2])
redis.call('HSET', KEYS[2], unpack(ARGV, 3))
return 1
"""

CLAIM_TICKETS = """
-- KEYS: policy_version, ledger, tickets, attempts, leases, lease_owner, version_offset
-- ARGV: worker_id, lease_ms, max_staleness, prompts_per_step, total_tickets (0 = unbounded),
--       count, loaded_version (-1: the latest published)
-- Returns up to `count` tickets {ticket_id, attempt, reissued}: expired leases to redo first,
-- then new tickets while the staleness gate is open. The gate counts the version the caller
-- has loaded (never above the published one), less version_offset (numbers a resumed trainer
-- skipped), so a generator never claims work its weights are too old for.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease_ms = tonumber(ARGV[2])
local count = tonumber(ARGV[6])
local out = {}
local expired = redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', now, 'LIMIT', 0, count)
for _, id in ipairs(expired) do
  local attempt = redis.call('HINCRBY', KEYS[4], id, 1)
  redis.call('ZADD', KEYS[5], now + lease_ms, id)
  redis.call('HSET', KEYS[6], id, ARGV[1])
  redis.call('HINCRBY', KEYS[2], 'reissued', 1)
  out[#out + 1] = {tonumber(id), attempt, 1}
end
local version = tonumber(redis.call('GET', KEYS[1]) or '0')
local loaded = tonumber(ARGV[7])
if loaded >= 0 and loaded < version then version = loaded end
version = math.max(version - tonumber(redis.call('GET', KEYS[7]) or '0'), 0)
local issued = tonumber(redis.call('HGET', KEYS[2], 'issued') or '0')
-- Dropped and skipped tickets give their slot back: neither is trained in a step.
local dropped = tonumber(redis.call('HGET', KEYS[2], 'dropped_stale') or '0')
  + tonumber(redis.call('HGET', KEYS[2], 'skipped') or '0')
-- The Python form is store.interfaces.admission_bound (the store contract checks both agree).
local bound = (version + tonumber(ARGV[3]) + 1) * tonumber(ARGV[4])
local total = tonumber(ARGV[5])
while #out < count do
  local live = issued - dropped
  if live >= bound or (total > 0 and live >= total) then break end
  redis.call('HINCRBY', KEYS[2], 'issued', 1)
  redis.call('HSET', KEYS[3], issued, 'open')
  redis.call('HSET', KEYS[4], issued, 0)
  redis.call('ZADD', KEYS[5], now + lease_ms, issued)
  redis.call('HSET', KEYS[6], issued, ARGV[1])
  out[#out + 1] = {issued, 0, 0}
  issued = issued + 1
end
return out
"""

RENEW_LEASES = """
-- KEYS: tickets, attempts, leases. ARGV: lease_ms, then ticket_id, attempt pairs.
-- Returns 1 per pair whose lease this attempt still holds (now renewed), else 0.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {}
for i = 2, #ARGV, 2 do
  local id, attempt = ARGV[i], ARGV[i + 1]
  local held = redis.call('HGET', KEYS[1], id) == 'open'
    and redis.call('HGET', KEYS[2], id) == attempt
    and redis.call('ZSCORE', KEYS[3], id)
  if held then
    redis.call('ZADD', KEYS[3], now + tonumber(ARGV[1]), id)
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
return out
"""

END_TICKETS = """
-- KEYS: tickets, leases, lease_owner, ledger, ticket_floor. ARGV: ticket_id, outcome pairs.
-- Per pair: 1 when this call ended the ticket, 0 when it had already ended (also when compacted
-- away below the floor; counted as duplicate). A ticket never issued is an error, raised before
-- anything changes.
local floor = tonumber(redis.call('GET', KEYS[5]) or '0')
for i = 1, #ARGV, 2 do
  if not redis.call('HGET', KEYS[1], ARGV[i]) and tonumber(ARGV[i]) >= floor then
    return redis.error_reply('unknown ticket ' .. ARGV[i])
  end
end
local out = {}
for i = 1, #ARGV, 2 do
  local id, outcome = ARGV[i], ARGV[i + 1]
  if redis.call('HGET', KEYS[1], id) ~= 'open' then
    redis.call('HINCRBY', KEYS[4], 'duplicate', 1)
    out[#out + 1] = 0
  else
    redis.call('HSET', KEYS[1], id, outcome)
    redis.call('ZREM', KEYS[2], id)
    redis.call('HDEL', KEYS[3], id)
    redis.call('HINCRBY', KEYS[4], outcome, 1)
    out[#out + 1] = 1
  end
end
return out
"""

REOPEN_TICKET = """
-- KEYS: tickets, leases, lease_owner, ledger. ARGV: ticket_id, requeue (1 or 0)
-- Puts a trained ticket whose update a trainer crash lost back to open. requeue=1 gives it an
-- expired lease, so the next claim reissues it; requeue=0 leaves it without a lease because the
-- trainer holds its rollout. Returns 1 when reopened or already open, 0 when dropped, skipped or
-- unknown.
local state = redis.call('HGET', KEYS[1], ARGV[1])
if state == 'trained' then
  redis.call('HSET', KEYS[1], ARGV[1], 'open')
  redis.call('HINCRBY', KEYS[4], 'trained', -1)
  redis.call('HINCRBY', KEYS[4], 'reopened', 1)
elseif state ~= 'open' then
  return 0
end
if ARGV[2] == '1' then
  redis.call('ZADD', KEYS[2], 0, ARGV[1])
else
  redis.call('ZREM', KEYS[2], ARGV[1])
  redis.call('HDEL', KEYS[3], ARGV[1])
end
return 1
"""

EXPIRE_LEASES = """
-- KEYS: tickets, leases. Expires the lease of every open ticket that holds one, so the next
-- claims reissue them (attempt + 1). Returns how many.
local count = 0
for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '(0', '+inf')) do
  if redis.call('HGET', KEYS[1], id) == 'open' then
    redis.call('ZADD', KEYS[2], 0, id)
    count = count + 1
  end
end
return count
"""

_CLAIMERS = """
-- evaluation_claimers: '<version>:<chunk>' -> JSON [attempt, claimer's worker id, the incarnation
-- of its registration (a token each start writes), or false when the registry did not report it
-- alive as it claimed].
-- ARGV[1]: the registry's key prefix (worker hashes are read by name, so this needs one Redis,
-- not a cluster).
local function incarnation(worker)
  local key = ARGV[1] .. worker
  if redis.call('EXISTS', key) == 0 or redis.call('HGET', key, 'status') == 'stopped' then
    return false
  end
  return redis.call('HGET', key, 'incarnation') or ''
end
-- Whether a claim's claimer still holds it: alive, under the registration it claimed in.
local function holds(claim)
  return claim[3] ~= false and incarnation(claim[2]) == claim[3]
end
"""

CLAIM_EVALUATION_CHUNK = (
    _CLAIMERS
    + """
-- KEYS: evaluation_claims, evaluation_claimers. ARGV: registry prefix, version, num_chunks, worker_id
-- Returns {chunk, attempt}: first a chunk of the version whose claimer no longer holds it (its
-- next attempt), else the next chunk never claimed (attempt 0, counted in evaluation_claims);
-- {} when no evaluation of the version is open or none is left.
local taken = redis.call('HGET', KEYS[1], ARGV[2])
if not taken then return {} end
taken = tonumber(taken)
local total = tonumber(ARGV[3])
local mine = incarnation(ARGV[4])
for chunk = 0, math.min(taken, total) - 1 do
  local field = ARGV[2] .. ':' .. chunk
  local held = redis.call('HGET', KEYS[2], field)
  if held then
    local claim = cjson.decode(held)
    if not holds(claim) then
      redis.call('HSET', KEYS[2], field, cjson.encode({claim[1] + 1, ARGV[4], mine}))
      return {chunk, claim[1] + 1}
    end
  end
end
if taken >= total then return {} end
redis.call('HSET', KEYS[1], ARGV[2], taken + 1)
redis.call('HSET', KEYS[2], ARGV[2] .. ':' .. taken, cjson.encode({0, ARGV[4], mine}))
return {taken, 0}
"""
)

AWAITED_EVALUATIONS = (
    _CLAIMERS
    + """
-- KEYS: evaluation_claimers. ARGV: registry prefix. Claimed chunks not in yet whose claimer
-- still holds them.
local count = 0
for _, held in ipairs(redis.call('HVALS', KEYS[1])) do
  if holds(cjson.decode(held)) then count = count + 1 end
end
return count
"""
)

ADD_EVALUATION = """
-- KEYS: evaluation_claimers, evaluations. ARGV: version, chunk, attempt, entry
-- Appends the entry when the attempt is the chunk's current claim, which it then ends; 1 when
-- added, 0 for an attempt claimed again meanwhile, a chunk already in or never claimed.
local field = ARGV[1] .. ':' .. ARGV[2]
local held = redis.call('HGET', KEYS[1], field)
if not held or cjson.decode(held)[1] ~= tonumber(ARGV[3]) then return 0 end
redis.call('HDEL', KEYS[1], field)
redis.call('RPUSH', KEYS[2], ARGV[4])
return 1
"""

COMPACT_TICKETS = """
-- KEYS: tickets, attempts, ledger, ticket_floor. ARGV: limit
-- Deletes the per-ticket entries of every ticket below the lowest one still open (or not yet
-- issued), and below `limit`, and records that floor; the ledger keeps the counts. Returns the
-- new floor.
local low = math.min(tonumber(redis.call('HGET', KEYS[3], 'issued') or '0'), tonumber(ARGV[1]))
local entries = redis.call('HGETALL', KEYS[1])
for i = 1, #entries, 2 do
  if entries[i + 1] == 'open' then
    local id = tonumber(entries[i])
    if id < low then low = id end
  end
end
local floor = tonumber(redis.call('GET', KEYS[4]) or '0')
for id = floor, low - 1 do
  redis.call('HDEL', KEYS[1], id)
  redis.call('HDEL', KEYS[2], id)
end
if low > floor then redis.call('SET', KEYS[4], low) end
return math.max(low, floor)
"""
