"""The Redis engine's server-side scripts (Lua, run with EVALSHA: each one atomic, one
round trip) and the keys they touch.

Every key of a session carries the session's hash tag, `<prefix>:{<tag>}:<kind>`, so all
of them live in one hash slot (one shard of a Redis Cluster):

    h   a hash: the session's head (`gen` names the live log and changes whenever it is
        replaced; `seq`, `link`, `hh` (the last line's h), `base` (the live log's first
        seq), `size` (bytes), `n` (batches)), its original `id`, and `tail`: bytes a
        repair left after the last complete batch (a torn tail, never read as lines)
    l   a list: the live log, one element per appended batch (its exact bytes); a
        snapshot install makes the snapshot line the first element
    a   a list: archived segments (the bytes each snapshot replaced, less the snapshot
        that opened them when the archive already holds what it covers), oldest first
    b   a list: each archived segment's "first_seq last_seq"
    s   a list: what repairs saved aside (the whole original live log, each time)
    w   a stream of one entry, rewritten on every change: what `wait` blocks on
    k   the repair hold (a token, set with an expiry)

The hash `h` also holds the session's index fields (`IndexingEngine`): `cr` and `up`,
its first and last append's times (microseconds), and `lb`, its labels (JSON). Three
sorted sets, one per store, order the sessions for the index's pages; every member has
score 0, so each set is ordered by its members' bytes (ZRANGEBYLEX: a keyset page is a
range that starts just past its cursor):

    <prefix>:ix:u   `ixkey(updated)` .. id   ("updated": read backwards, newest first,
    <prefix>:ix:c   `ixkey(created)` .. id    ties by id descending, as Python sorts)
    <prefix>:ix:i   id                       ("id")

`ixkey(t)` is t + 2^52 as 14 hex digits: fixed width, so byte order is time order
(times are clamped to +-2^52 us, about 1827..2112; exact in Lua's doubles). A member
whose session expired (`ttl`) or was written again stays until a page walks past it
(`INDEX_DROP`).

KEYS, in this order in every script: h l a b s w k, then the global feed stream (one key
for the whole store: the only key outside the session's slot; when the feed is off the
session's own `w` stands in and is not written to), then ix:u ix:c ix:i (outside the
session's slot too).

Every write script refreshes the expiry (`ttl`, milliseconds; 0: none) of keys h..w to
the same deadline, so a session expires whole; scripts see one frozen clock, so no script
ever finds part of a session expired.
"""

from __future__ import annotations

__all__ = [
    "APPEND", "INDEX_DROP", "INDEX_SET", "INSTALL", "IX_OFFSET", "KINDS", "PRUNE", "READ",
    "READ_ONLY", "RELEASE", "REMOVE", "REWRITE", "ixkey",
]  # fmt: skip

KINDS = ("h", "l", "a", "b", "s", "w", "k")
READ_ONLY = frozenset({"READ"})  # the scripts flagged no-writes: run with EVALSHA_RO
IX_OFFSET = 1 << 52  # what `ixkey` adds to a time: every member's time is non-negative


def ixkey(ts_us: int) -> str:
    """A time's prefix in the index's sorted sets (what the scripts' `ixkey` writes)."""
    return f"{min(max(ts_us, -IX_OFFSET), IX_OFFSET - 1) + IX_OFFSET:014x}"


_PRELUDE = """
local function touch(ttl)
  if ttl > 0 then
    for i = 1, 6 do redis.call('PEXPIRE', KEYS[i], ttl) end
  end
end
local function wake()
  redis.call('XADD', KEYS[6], 'MAXLEN', '1', '*', 'x', '1')
end
local function head()
  local c = redis.call('HMGET', KEYS[1], 'gen', 'seq', 'link', 'hh', 'base', 'size', 'n', 'tail')
  return {c[1] or '', c[2] or '0', c[3] or '', c[4] or '', c[5] or '0', c[6] or '0',
          c[7] or '0'}, c[8]
end
local function held(token)
  local holder = redis.call('GET', KEYS[7])
  return holder and holder ~= token
end
local function ixkey(ts)
  if ts > 4503599627370495 then ts = 4503599627370495 end
  if ts < -4503599627370496 then ts = -4503599627370496 end
  return string.format('%014x', ts + 4503599627370496)
end
-- the session's index fields and members: times `cr`/`up` (numbers) replacing `old`
-- ({cr, up} as stored, or nils)
local function index_set(id, old, cr, up)
  if old[2] then redis.call('ZREM', KEYS[9], ixkey(tonumber(old[2])) .. id) end
  if old[1] then redis.call('ZREM', KEYS[10], ixkey(tonumber(old[1])) .. id) end
  redis.call('ZADD', KEYS[9], 0, ixkey(up) .. id)
  redis.call('ZADD', KEYS[10], 0, ixkey(cr) .. id)
  redis.call('ZADD', KEYS[11], 0, id)
  -- '%d', not the number itself: a number argument may be sent as 1.7e+15
  redis.call('HSET', KEYS[1], 'cr', string.format('%d', cr), 'up', string.format('%d', up))
end
local function push_all(key, items, from, to)
  local i = from
  while i <= to do
    local j = math.min(i + 999, to)
    redis.call('RPUSH', key, unpack(items, i, j))
    i = j + 1
  end
end
"""

APPEND = (
    _PRELUDE
    + """
-- ARGV: expected seq, expected link, first seq, last seq, last h, link after, data,
--       session id, a new log's gen, ttl, feed maxlen (-1: no feed, 0: untrimmed),
--       the batch's time (us; '': the server's clock), its labels (JSON; '': unchanged)
-- -> {0 written | 1 moved | 2 held by a repair, head...}
if held('') then return {2} end
local c, tail = head()
if c[2] ~= ARGV[1] or c[3] ~= ARGV[2] then
  if c[2] == ARGV[4] and c[4] == ARGV[5] then
    -- this very batch is the head: a retry of an append whose reply was lost
    return {0, unpack(c)}
  end
  return {1, unpack(c)}
end
if tail then
  redis.call('RPUSH', KEYS[5], tail)
  redis.call('HDEL', KEYS[1], 'tail')
end
local gen = c[1]
if gen == '' then
  gen = ARGV[9]
  redis.call('HSET', KEYS[1], 'id', ARGV[8], 'gen', gen)
end
-- the index, as `eventstore.engines.base.index_appended` says: created at the first
-- committed batch (a log emptied by a repair starts again), updated at this one
local ts = ARGV[12]
if ts == '' then
  local t = redis.call('TIME')
  ts = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  ts = tonumber(ts)
end
local old = redis.call('HMGET', KEYS[1], 'cr', 'up')
local cr = ts
if c[2] ~= '0' and old[1] then cr = tonumber(old[1]) end
index_set(ARGV[8], old, cr, math.max(ts, cr))
if ARGV[13] ~= '' then redis.call('HSET', KEYS[1], 'lb', ARGV[13]) end
local base = c[5]
if base == '0' then base = ARGV[3] end
local size = tonumber(c[6]) + string.len(ARGV[7])
local n = redis.call('RPUSH', KEYS[2], ARGV[7])
redis.call('HSET', KEYS[1], 'seq', ARGV[4], 'link', ARGV[6], 'hh', ARGV[5], 'base', base,
           'size', size, 'n', n)
wake()
local maxlen = tonumber(ARGV[11])
if maxlen > 0 then
  redis.call('XADD', KEYS[8], 'MAXLEN', '~', maxlen, '*', 's', ARGV[8], 'q', ARGV[3], 'd', ARGV[7])
elseif maxlen == 0 then
  redis.call('XADD', KEYS[8], '*', 's', ARGV[8], 'q', ARGV[3], 'd', ARGV[7])
end
touch(tonumber(ARGV[10]))
return {0, gen, ARGV[4], ARGV[6], ARGV[5], base, tostring(size), tostring(n)}
"""
)

# `no-writes` (Redis 7.0+), run with EVALSHA_RO: a read runs while the server holds writes
# back (CLIENT PAUSE WRITE, as during a FAILOVER) and on a replica; without it Redis holds
# every script back
READ = (
    "#!lua flags=no-writes"
    + _PRELUDE
    + """
-- ARGV: the position's gen and batch count -> {head..., from, batches...}
local c = head()
local from = 0
if c[1] ~= '' and c[1] == ARGV[1] then from = tonumber(ARGV[2]) end
local out = c
out[8] = tostring(from)
if c[1] ~= '' then
  local items = redis.call('LRANGE', KEYS[2], from, -1)
  for i = 1, #items do out[8 + i] = items[i] end
end
return out
"""
)

INSTALL = (
    _PRELUDE
    + """
-- ARGV: covers' gen, batch count and seq, the snapshot line, its h, keep (1/0), the new
--       gen, ttl -> {0 | 1 moved | 2 held, head..., bytes before, archived (1/0),
--       the replaced log's first seq}
if held('') then return {2} end
local c = head()
local cn = tonumber(ARGV[2])
if c[1] == '' or c[1] ~= ARGV[1] or tonumber(c[7]) < cn then return {1, unpack(c)} end
local items = redis.call('LRANGE', KEYS[2], 0, -1)
local archived, first = '0', c[5]
if ARGV[6] == '1' and cn > 0 then
  local kept = table.concat(items, '', 1, cn)
  if string.sub(kept, 1, 19) == '{"type":"snapshot",' then
    -- the archive holds what that snapshot replaced: keep only the lines after it, so
    -- the archive holds each event once (as the file and memory engines do)
    for _, bound in ipairs(redis.call('LRANGE', KEYS[4], 0, -1)) do
      if string.sub(bound, string.find(bound, ' ', 1, true) + 1) == c[5] then
        kept = string.sub(kept, string.find(kept, '\\n', 1, true) + 1)
        first = tostring(tonumber(c[5]) + 1)
        break
      end
    end
  end
  if kept ~= '' then
    redis.call('RPUSH', KEYS[3], kept)
    redis.call('RPUSH', KEYS[4], first .. ' ' .. ARGV[3])
    archived = '1'
  end
end
redis.call('DEL', KEYS[2])
redis.call('RPUSH', KEYS[2], ARGV[4])
push_all(KEYS[2], items, cn + 1, #items)
local size = string.len(ARGV[4])
for i = cn + 1, #items do size = size + string.len(items[i]) end
local hh = c[4]
if #items == cn then hh = ARGV[5] end
local n = 1 + #items - cn
redis.call('HSET', KEYS[1], 'gen', ARGV[7], 'hh', hh, 'base', ARGV[3], 'size', size, 'n', n)
wake()
touch(tonumber(ARGV[8]))
return {0, ARGV[7], c[2], c[3], hh, ARGV[3], tostring(size), tostring(n), c[6], archived, first}
"""
)

REMOVE = (
    _PRELUDE
    + """
-- -> {0 nothing | 1 removed | 2 held}
if held('') then return {2} end
local c = redis.call('HMGET', KEYS[1], 'seq', 'id', 'cr', 'up')
local seq = c[1]
local had = (seq and seq ~= '0') or redis.call('EXISTS', KEYS[3]) == 1
if c[2] then
  -- the index's members go with the session
  if c[4] then redis.call('ZREM', KEYS[9], ixkey(tonumber(c[4])) .. c[2]) end
  if c[3] then redis.call('ZREM', KEYS[10], ixkey(tonumber(c[3])) .. c[2]) end
  redis.call('ZREM', KEYS[11], c[2])
end
if redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]) == 0 then return {0} end
wake()
redis.call('PEXPIRE', KEYS[6], 60000)
if had then return {1} end
return {0}
"""
)

REWRITE = (
    _PRELUDE
    + """
-- ARGV: hold token, new gen, committed bytes, torn tail, seq, link, hh, base, session
--       id, ttl -> {0, saved index} | {3} (the hold expired)
if redis.call('GET', KEYS[7]) ~= ARGV[1] then return {3} end
local tail = redis.call('HGET', KEYS[1], 'tail')
local items = redis.call('LRANGE', KEYS[2], 0, -1)
local k = redis.call('RPUSH', KEYS[5], table.concat(items) .. (tail or ''))
redis.call('DEL', KEYS[2])
local n = 0
if ARGV[3] ~= '' then n = redis.call('RPUSH', KEYS[2], ARGV[3]) end
redis.call('HSET', KEYS[1], 'id', ARGV[9], 'gen', ARGV[2], 'seq', ARGV[5], 'link', ARGV[6],
           'hh', ARGV[7], 'base', ARGV[8], 'size', string.len(ARGV[3]), 'n', n)
if ARGV[4] ~= '' then
  redis.call('HSET', KEYS[1], 'tail', ARGV[4])
else
  redis.call('HDEL', KEYS[1], 'tail')
end
wake()
touch(tonumber(ARGV[10]))
return {0, k}
"""
)

RELEASE = """
-- KEYS: the hold key; ARGV: its token
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

PRUNE = (
    _PRELUDE
    + """
-- ARGV: before seq, ttl -> {0 | 2 held, "first last", size, ...} of the segments removed
if held('') then return {2} end
local bounds = redis.call('LRANGE', KEYS[4], 0, -1)
local before = tonumber(ARGV[1])
local k = 0
for i = 1, #bounds do
  local sp = string.find(bounds[i], ' ', 1, true)
  if tonumber(string.sub(bounds[i], sp + 1)) >= before then break end
  k = i
end
local out = {0}
if k == 0 then return out end
local blobs = redis.call('LRANGE', KEYS[3], 0, k - 1)
for i = 1, k do
  out[2 * i] = bounds[i]
  out[2 * i + 1] = string.len(blobs[i])
end
redis.call('LTRIM', KEYS[3], k, -1)
redis.call('LTRIM', KEYS[4], k, -1)
touch(tonumber(ARGV[2]))
return out
"""
)

INDEX_SET = (
    _PRELUDE
    + """
-- a rebuild's entry (`replace_index`): ARGV: its last seq, created, updated, labels
-- (JSON), the session id -> 1 set | 0 kept (no such session, or written since: a
-- higher seq; the newer of the two `updated` is kept)
local c = redis.call('HMGET', KEYS[1], 'seq', 'cr', 'up', 'id')
if not c[4] or tonumber(c[1] or '0') > tonumber(ARGV[1]) then return 0 end
local up = tonumber(ARGV[3])
if c[3] and tonumber(c[3]) > up then up = tonumber(c[3]) end
index_set(ARGV[5], {c[2], c[3]}, tonumber(ARGV[2]), up)
redis.call('HSET', KEYS[1], 'lb', ARGV[4])
return 1
"""
)

INDEX_DROP = (
    _PRELUDE
    + """
-- KEYS: a session's h, one of the index's sets; ARGV: a member of it a page found
-- standing for no session, its field ('up', 'cr'; '' for ix:i), the session id
-- -> 1 dropped | 0 kept (the session's current member after all)
local v = redis.call('HGET', KEYS[1], 'cr')
if ARGV[2] ~= '' then v = redis.call('HGET', KEYS[1], ARGV[2]) end
local current = nil
if v then
  current = ARGV[3]
  if ARGV[2] ~= '' then current = ixkey(tonumber(v)) .. ARGV[3] end
end
if current ~= ARGV[1] then
  redis.call('ZREM', KEYS[2], ARGV[1])
  return 1
end
return 0
"""
)
