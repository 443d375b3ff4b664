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
    b   a list: each archived segment's "first_seq last_seq" (one for each of `a`'s;
        with `a`, only beside a head: without one, no append starts a session there)
    s   a list: what repairs saved aside (the whole original live log, each time)
    w   a stream of one entry, rewritten on every change: what `wait` blocks on
    k   the repair hold (a token, set with an expiry)
    q   a list: the live log's index, one element per element of `l`: "<its first seq>
        <the live log's bytes up to its end>" (and " s" on the first when that element
        opens with a snapshot line); what finds a line by its seq (`LINES_AT`). Kept by every script
        that writes `l`; a log written before it existed has none until it is replaced
        (compaction, repair), and `LINES_AT` answers nothing for it
    c   a hash: the face's fold caches (`CachingEngine`), two fields each: `h:<name>`,
        the head it was folded to ("gen seq link hh base size n"), and `d:<name>`, its
        bytes. Kept only at a head of the live log; one whose `gen` is not the log's,
        or whose batch `n` does not end with its `hh`, is never read. Emptied when the
        live log is replaced (a snapshot installed, a repair), removed with the session

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
whose session expired (`ttl`) stays, passed over by every page (a read writes nothing),
until a rebuild of the index drops it (`INDEX_DROP`).

KEYS, in this order in every script: h l a b s w k, then the global feed stream (one key
for the whole store, an entry an append: `s` the session id, `q` its first seq, `d` its
bytes, `p` the id of the entry before it; the only key outside the session's slot; when
the feed is off the session's own `w` stands in and is not written to), then ix:u ix:c
ix:i (outside the session's slot too), then c, then q.

Every write script refreshes the expiry (`ttl`, milliseconds; 0: none) of keys h..w, c
and q to the same deadline, so a session expires whole (a kept cache, and every key a
store without a ttl writes, takes the head's expiry as it is); scripts see one frozen
clock, so no script ever finds part of a session expired.
"""

from __future__ import annotations

__all__ = [
    "APPEND", "CACHE_DROP_PARTS", "CACHE_OPEN", "CACHE_STORE", "INDEX_DROP", "INDEX_SET",
    "INSTALL", "IX_OFFSET", "KINDS", "LINES_AT", "PRUNE", "READ", "READ_ONLY", "RELEASE",
    "REMOVE", "REWRITE", "TAIL", "ixkey",
]  # fmt: skip

KINDS = ("h", "l", "a", "b", "s", "w", "k")
CACHES = "c"  # the kind of the caches' key, after the index's sets in KEYS
OFFSETS = "q"  # the kind of the live log's index, the last of KEYS
# the scripts flagged no-writes: run with EVALSHA_RO
READ_ONLY = frozenset({"READ", "CACHE_OPEN", "LINES_AT", "TAIL"})
IX_OFFSET = 1 << 52  # what `ixkey` adds to a time: every member's time is non-negative


def ixkey(ts_us: int) -> str:
    """A time's prefix in the index's sorted sets (what the scripts' `ixkey` writes)."""
    return f"{min(max(ts_us, -IX_OFFSET), IX_OFFSET - 1) + IX_OFFSET:014x}"


_PRELUDE = """
local function touch(ttl)
  -- one deadline for every key of the session, as a time (PEXPIRE's, one per key, each
  -- from the clock as it stands, set keys a millisecond apart). A store without a ttl
  -- of its own keeps the session's (another store's) on every key, those it made anew
  -- too: no key outlives the head and lands under a later session
  local at
  if ttl > 0 then
    local now = redis.call('TIME')
    at = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000) + ttl
  else
    at = redis.call('PEXPIRETIME', KEYS[1])
  end
  if at > 0 then
    for i = 1, 6 do redis.call('PEXPIREAT', KEYS[i], at) end
    redis.call('PEXPIREAT', KEYS[12], at)
    redis.call('PEXPIREAT', KEYS[13], at)
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
-- a stored time field (`cr`, `up`) as a number, or nil for one that is not the whole
-- number the scripts write (edited from outside: never read as a time)
local function num(v)
  if v and string.match(v, '^%-?%d+$') then return tonumber(v) end
  return nil
end
local function ixkey(ts)
  if ts > 4503599627370495 then ts = 4503599627370495 end
  if ts < -4503599627370496 then ts = -4503599627370496 end
  return string.format('%014x', ts + 4503599627370496)
end
-- the session's index fields and members: times `cr`/`up` (numbers) replacing `old`
-- ({cr, up} as stored, or nils)
local function index_set(id, old, cr, up)
  if num(old[2]) then redis.call('ZREM', KEYS[9], ixkey(num(old[2])) .. id) end
  if num(old[1]) then redis.call('ZREM', KEYS[10], ixkey(num(old[1])) .. id) end
  redis.call('ZADD', KEYS[9], 0, ixkey(up) .. id)
  redis.call('ZADD', KEYS[10], 0, ixkey(cr) .. id)
  redis.call('ZADD', KEYS[11], 0, id)
  -- '%d', not the number itself: a number argument may be sent as 1.7e+15
  redis.call('HSET', KEYS[1], 'cr', string.format('%d', cr), 'up', string.format('%d', up))
end
-- the type of each of KEYS (in their order): a key of another type, put there from
-- outside, refuses a writing script before its first write (Redis does not roll a
-- script back: one failing on a later key left its line pushed and its head moved)
local KEY_TYPES = {'hash', 'list', 'list', 'list', 'list', 'stream', 'string', 'stream',
                   'zset', 'zset', 'zset', 'hash', 'list'}
local function check_types()
  for i = 1, #KEYS do
    local t = redis.call('TYPE', KEYS[i])['ok']
    if t ~= 'none' and t ~= KEY_TYPES[i] then
      error({err = 'WRONGTYPE ' .. KEYS[i] .. ' is a ' .. t .. ', not a ' .. KEY_TYPES[i]})
    end
  end
end
local function push_all(key, items, from, to)
  local i = from
  while i <= to do
    local j = math.min(i + 999, to)
    redis.call('RPUSH', key, unpack(items, i, j))
    i = j + 1
  end
end
-- the live log's index (`q`) written anew for its elements `items` (a snapshot line
-- first when `snap`), the first of which starts at seq `first`
local function index_log(items, first, snap)
  redis.call('DEL', KEYS[13])
  local out, at = {}, 0
  for i = 1, #items do
    local seq = first
    if i > 1 then
      seq = tonumber(string.match(items[i], '^{"type":"[^"\\\\]*","seq":(%d+),'))
      if not seq then
        redis.call('DEL', KEYS[13])  -- not a line an append wrote: no index
        return
      end
    end
    at = at + string.len(items[i])
    out[i] = string.format('%d %d', seq, at)
    if i == 1 and snap then out[i] = out[i] .. ' s' end
  end
  push_all(KEYS[13], out, 1, #out)
end
"""

# the prelude of a script that writes and is given every key: nothing of another type
_WRITES = _PRELUDE + "check_types()\n"

APPEND = (
    _WRITES
    + """
-- ARGV: expected seq, expected link, first seq, last seq, last h, link after, data,
--       session id, a new log's gen, ttl, feed maxlen (-1: no feed, 0: untrimmed),
--       the batch's time (us; '': the server's clock), its labels (JSON; '': unchanged)
-- -> {0 written | 1 moved | 2 held by a repair, head... | 3 the head does not count
--     the live log's appends, how many it holds | 4 its index times (`cr`, `up`) are
--     not numbers | 5 no head but an archive, its segments}
if held('') then return {2} end
local c, tail = head()
if c[2] ~= ARGV[1] or c[3] ~= ARGV[2] then
  if c[2] == ARGV[4] and c[4] == ARGV[5] then
    -- this very batch is the head: a retry of an append whose reply was lost
    return {0, unpack(c)}
  end
  return {1, unpack(c)}
end
-- the head or the list edited or deleted from outside: nothing is built on them
local batches = redis.call('LLEN', KEYS[2])
if batches ~= tonumber(c[7]) then return {3, batches, c[7]} end
-- no head, but an archive: the head and live log went without it (deleted, evicted);
-- a new session started here would take that archive for its history
if c[1] == '' and redis.call('EXISTS', KEYS[3], KEYS[4]) > 0 then
  return {5, redis.call('LLEN', KEYS[3])}
end
local old = redis.call('HMGET', KEYS[1], 'cr', 'up')
if (old[1] and not num(old[1])) or (old[2] and not num(old[2])) then return {4} end
if tail then
  redis.call('RPUSH', KEYS[5], tail)
  redis.call('HDEL', KEYS[1], 'tail')
end
local gen = c[1]
if gen == '' then
  gen = ARGV[9]
  redis.call('HSET', KEYS[1], 'id', ARGV[8], 'gen', gen)
  -- a log made anew has an empty index: one its head left behind (deleted, evicted)
  -- was never extended, being longer than the log
  redis.call('DEL', KEYS[13])
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
local cr = ts
if c[2] ~= '0' and old[1] then cr = num(old[1]) end
index_set(ARGV[8], old, cr, math.max(ts, cr))
if ARGV[13] ~= '' then redis.call('HSET', KEYS[1], 'lb', ARGV[13]) end
local base = c[5]
if base == '0' then base = ARGV[3] end
local size = tonumber(c[6]) + string.len(ARGV[7])
local n = redis.call('RPUSH', KEYS[2], ARGV[7])
-- the index, when it holds every element before this one (a log written before it
-- existed has none until it is replaced)
if redis.call('LLEN', KEYS[13]) == n - 1 then
  redis.call('RPUSH', KEYS[13], string.format('%d %d', tonumber(ARGV[3]), size))
end
redis.call('HSET', KEYS[1], 'seq', ARGV[4], 'link', ARGV[6], 'hh', ARGV[5], 'base', base,
           'size', size, 'n', n)
wake()
local maxlen = tonumber(ARGV[11])
if maxlen >= 0 then
  -- with the id of the entry before it (`p`): a reader past that entry whose next one
  -- names a later one knows a trim took lines it never read
  local last = redis.call('XREVRANGE', KEYS[8], '+', '-', 'COUNT', 1)
  local entry = {'s', ARGV[8], 'q', ARGV[3], 'd', ARGV[7], 'p', last[1] and last[1][1] or '0-0'}
  if maxlen > 0 then
    redis.call('XADD', KEYS[8], 'MAXLEN', '~', maxlen, '*', unpack(entry))
  else
    redis.call('XADD', KEYS[8], '*', unpack(entry))
  end
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
-- with no head too: a live log whose head was deleted from outside is no empty session
-- (the reader's count check refuses it, as every append does)
local items = redis.call('LRANGE', KEYS[2], from, -1)
for i = 1, #items do out[8 + i] = items[i] end
return out
"""
)

INSTALL = (
    _WRITES
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
local live = {ARGV[4]}
for i = cn + 1, #items do live[#live + 1] = items[i] end
index_log(live, tonumber(ARGV[3]), true)
local size = string.len(ARGV[4])
for i = cn + 1, #items do size = size + string.len(items[i]) end
local hh = c[4]
if #items == cn then hh = ARGV[5] end
local n = 1 + #items - cn
redis.call('HSET', KEYS[1], 'gen', ARGV[7], 'hh', hh, 'base', ARGV[3], 'size', size, 'n', n)
redis.call('DEL', KEYS[12])
wake()
touch(tonumber(ARGV[8]))
return {0, ARGV[7], c[2], c[3], hh, ARGV[3], tostring(size), tostring(n), c[6], archived, first}
"""
)

REMOVE = (
    _PRELUDE  # (not _WRITES: a purge clears a session whatever was put in its keys)
    + """
-- -> {0 nothing | 1 removed | 2 held}
if held('') then return {2} end
local c = redis.call('HMGET', KEYS[1], 'seq', 'id', 'cr', 'up')
local seq = c[1]
local had = (seq and seq ~= '0') or redis.call('EXISTS', KEYS[3]) == 1
if c[2] then
  -- the index's members go with the session
  if num(c[4]) then redis.call('ZREM', KEYS[9], ixkey(num(c[4])) .. c[2]) end
  if num(c[3]) then redis.call('ZREM', KEYS[10], ixkey(num(c[3])) .. c[2]) end
  redis.call('ZREM', KEYS[11], c[2])
end
redis.call('DEL', KEYS[12], KEYS[13])
if redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]) == 0 then return {0} end
wake()
redis.call('PEXPIRE', KEYS[6], 60000)
if had then return {1} end
return {0}
"""
)

REWRITE = (
    _WRITES
    + """
-- ARGV: hold token, new gen, committed bytes, torn tail, seq, link, hh, base, session
--       id, ttl -> {0, saved index} | {3} (the hold expired) | {4} (the session did)
if redis.call('GET', KEYS[7]) ~= ARGV[1] then return {3} end
-- the head, there when the hold read the session, gone: it expired meanwhile (nothing
-- else removes a held session); written back, it would live again, or forever
if redis.call('EXISTS', KEYS[1]) == 0 then return {4} end
local tail = redis.call('HGET', KEYS[1], 'tail')
local items = redis.call('LRANGE', KEYS[2], 0, -1)
local k = redis.call('RPUSH', KEYS[5], table.concat(items) .. (tail or ''))
redis.call('DEL', KEYS[2], KEYS[12])
local n = 0
redis.call('DEL', KEYS[13])
if ARGV[3] ~= '' then
  n = redis.call('RPUSH', KEYS[2], ARGV[3])
  index_log({ARGV[3]}, tonumber(ARGV[8]), string.sub(ARGV[3], 1, 19) == '{"type":"snapshot",')
end
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
    _WRITES
    + """
-- ARGV: before seq, ttl -> {0 | 2 held, "first last", size, ...} of the segments removed
--       | {3, segments, bounds}: the two lists do not pair up (one deleted from outside)
if held('') then return {2} end
local segments, bounded = redis.call('LLEN', KEYS[3]), redis.call('LLEN', KEYS[4])
if segments ~= bounded then return {3, segments, bounded} end
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
    _WRITES
    + """
-- a rebuild's entry (`replace_index`): ARGV: its last seq, created, updated, labels
-- (JSON), the session id -> 1 set | 0 kept (no such session, or written since: a
-- higher seq; the newer of the two `updated` is kept)
local c = redis.call('HMGET', KEYS[1], 'seq', 'cr', 'up', 'id')
if not c[4] or tonumber(c[1] or '0') > tonumber(ARGV[1]) then return 0 end
local up = tonumber(ARGV[3])
if num(c[3]) and num(c[3]) > up then up = num(c[3]) end
index_set(ARGV[5], {c[2], c[3]}, tonumber(ARGV[2]), up)
redis.call('HSET', KEYS[1], 'lb', ARGV[4])
return 1
"""
)

INDEX_DROP = (
    _PRELUDE
    + """
-- KEYS: a session's h, one of the index's sets; ARGV: a member of it a rebuild found
-- standing for no session, its field ('up', 'cr'; '' for ix:i), the session id
-- -> 1 dropped | 0 kept (the session's current member after all)
local v = redis.call('HGET', KEYS[1], 'cr')
if ARGV[2] ~= '' then v = redis.call('HGET', KEYS[1], ARGV[2]) end
local current = nil
if v then
  current = ARGV[3]
  if ARGV[2] ~= '' then current = num(v) and ixkey(num(v)) .. ARGV[3] end
end
if current ~= ARGV[1] then
  redis.call('ZREM', KEYS[2], ARGV[1])
  return 1
end
return 0
"""
)

CACHE_STORE = (
    _WRITES
    + """
-- ARGV: the cache's name, its head (gen seq link hh base size n, one argument each),
--       its bytes -> 1 kept | 0 not (no live log, or the head is not a point of it)
local c = head()
local n = tonumber(ARGV[8])
if c[1] == '' or c[1] ~= ARGV[2] or n < 1 or tonumber(c[7]) < n then return 0 end
local at = table.concat({ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8]}, ' ')
redis.call('HSET', KEYS[12], 'h:' .. ARGV[1], at, 'd:' .. ARGV[1], ARGV[9])
-- the session's expiry, as it stands: a cache kept by a reader does not extend it
local at = redis.call('PEXPIRETIME', KEYS[1])
if at > 0 then redis.call('PEXPIREAT', KEYS[12], at) end
return 1
"""
)

# a cache found live (its head and bytes), else a mark found live; then the head and
# the batches after the cache's head (from the start when no cache was found, if asked),
# as READ gives them, when at most ARGV[3] batches. Heads go as one string each ("gen
# seq link hh base size n"): a reply of few elements (each costs the client's parser)
CACHE_OPEN = (
    "#!lua flags=no-writes"
    + _PRELUDE
    + """
-- ARGV: the cache's name ('': none), a mark's name ('': none), the most batches read on
--       (-1: none), whether to read on from the start when no cache is found (1 | 0)
-- -> {what was found ('c' the cache, 'm' the mark, 'r' the read on, in that order),
--     the cache's head, its bytes, the mark's head, its bytes, the head, batches...}
local c = head()
if not string.match(c[7], '^%d+$') then
  -- a count of appends edited from outside to no number (compared below, it failed
  -- the script): the head alone, which the caller refuses naming the session
  return {'r', '', '', '', '', table.concat(c, ' ', 1, 7)}
end
local function kept(name)
  if name == '' or c[1] == '' then return nil end
  local got = redis.call('HMGET', KEYS[12], 'h:' .. name, 'd:' .. name)
  if not got[1] or not got[2] then return nil end
  local at = {}
  for f in string.gmatch(got[1] .. ' ', '([^ ]*) ') do at[#at + 1] = f end
  if #at ~= 7 or at[1] ~= c[1] then return nil end
  for _, i in ipairs({2, 5, 6, 7}) do
    if not string.match(at[i], '^%d+$') then return nil end
  end
  local n, cn = tonumber(at[7]), tonumber(c[7])
  if n < 1 or n > cn then return nil end
  local last = redis.call('LINDEX', KEYS[2], n - 1 - cn)
  if not last or string.sub(last, -25) ~= ',"h":"' .. at[4] .. '"}\\n' then return nil end
  return {got[1], got[2], n}
end
local out = {'', '', '', '', '', ''}
local from = 0
local cache = kept(ARGV[1])
if cache then
  out[1], out[2], out[3], from = 'c', cache[1], cache[2], cache[3]
else
  if ARGV[4] ~= '1' then return out end
  local mark = kept(ARGV[2])
  if mark then out[1], out[4], out[5] = 'm', mark[1], mark[2] end
end
if tonumber(c[7]) - from > tonumber(ARGV[3]) then return out end
out[1] = out[1] .. 'r'
out[6] = table.concat(c, ' ', 1, 7)
-- with no head too, as READ: a live log whose head is gone is refused by the count check
local items = redis.call('LRANGE', KEYS[2], from, -1)
for i = 1, #items do out[6 + i] = items[i] end
return out
"""
)

CACHE_DROP_PARTS = """
-- KEYS: a session's caches; ARGV: a cache's name, the first part to remove
-- -> how many fields were removed
local prefix = ARGV[1] .. '#'
local start = tonumber(ARGV[2])
local gone = 0
for _, f in ipairs(redis.call('HKEYS', KEYS[1])) do
  local name = string.sub(f, 3)
  if string.sub(name, 1, #prefix) == prefix then
    local k = string.sub(name, #prefix + 1)
    if string.match(k, '^%d+$') and tonumber(k) >= start then
      gone = gone + redis.call('HDEL', KEYS[1], f)
    end
  end
end
return gone
"""

# a line's seq is found in the index (`q`) by a binary search over its elements' first
# seqs, then within its element by counting newlines (JSON escapes every newline inside
# a line)
# the head (`c`, as `head()` gives it) and `line_of(seq)`: the line of `seq` in the live
# log (its newline included), its offset and the last 25 bytes of the line before it
# ('' for the log's first line), or nil (a seq it does not hold, the line right after
# its opening snapshot, a log without an index); shared by LINES_AT and TAIL
_LINE_OF = """
local c = head()
local n = tonumber(c[7])
-- (no line is found in a log without an index)
local indexed = c[1] ~= '' and redis.call('LLEN', KEYS[13]) == n
local entries, batches = {}, {}
local function entry(i)  -- 0-based: {first seq, end offset, a snapshot line?} | false
  if entries[i] == nil then
    local first, at, snap = string.match(redis.call('LINDEX', KEYS[13], i) or '',
                                         '^(%d+) (%d+)( ?s?)$')
    entries[i] = first ~= nil and {tonumber(first), tonumber(at), snap == ' s'}
  end
  return entries[i]
end
local function batch(i)
  if not batches[i] then batches[i] = redis.call('LINDEX', KEYS[2], i) end
  return batches[i]
end
-- where the last line found starts: {element, seq, start}. The seqs come ascending, so
-- the next one in the same element is counted on from there, not from the element's
-- start (one element can hold a whole log: a batch of many lines, a repair's rewrite;
-- counting each seq from its start made a batch's read quadratic in it, and a script
-- blocks the whole server)
local cursor = {-1, 0, 1}
-- the line of `seq` (its newline included), its offset and the end of the line before
-- it, or nil
local function line_of(seq)
  if not indexed then return nil end
  local lo, hi = 0, n - 1  -- the last element whose first seq is at most seq
  while lo < hi do
    local mid = math.floor((lo + hi + 1) / 2)
    local e = entry(mid)
    if not e then return nil end
    if e[1] <= seq then lo = mid else hi = mid - 1 end
  end
  local e, b = entry(lo), batch(lo)
  if not e or not b or (e[3] and seq <= e[1] + 1) then return nil end  -- (the snapshot,
  -- or the line after it, which chains to the snapshot's base_h)
  local start, from = 1, e[1]
  if cursor[1] == lo and from <= cursor[2] and cursor[2] <= seq then
    from, start = cursor[2], cursor[3]
  end
  for _ = 1, seq - from do
    local nl = string.find(b, '\\n', start, true)
    if not nl then return nil end
    start = nl + 1
  end
  cursor = {lo, seq, start}
  local stop = string.find(b, '\\n', start, true)
  if not stop then return nil end
  local offset, before = start - 1, ''
  local p = lo > 0 and entry(lo - 1)
  if lo > 0 then
    if not p then return nil end
    offset = offset + p[2]
  end
  if start > 25 then
    before = string.sub(b, start - 25, start - 1)
  elseif start > 1 then
    -- a line before it too short to end with an `h` (written from outside: a sub
    -- from below 1 counts from the element's end, whose '' read as a log's start)
    return nil
  elseif lo > 0 then
    if p[3] and p[1] == seq - 1 then return nil end  -- right after the snapshot
    before = string.sub(batch(lo - 1) or '', -25)
  end
  return string.sub(b, start, stop), offset, before
end
local function add(out, seq)
  if seq >= tonumber(c[5]) and seq <= tonumber(c[2]) then
    local line, offset, before = line_of(seq)
    if line then
      out[#out + 1] = tostring(seq)
      out[#out + 1] = line
      out[#out + 1] = tostring(offset)
      out[#out + 1] = before
    end
  end
end
"""

LINES_AT = (
    "#!lua flags=no-writes"
    + _PRELUDE
    + _LINE_OF
    + """
-- ARGV: seqs, ascending -> {seq, line (its newline included), offset, the last 25 bytes
--       of the line before it ('' for the log's first line), ...}; a seq the live log
--       does not hold, or right after its opening snapshot, is left out; nothing for a
--       log without an index
local out = {}
for _, a in ipairs(ARGV) do
  local seq = tonumber(a)
  if seq then add(out, seq) end
end
return out
"""
)

TAIL = (
    "#!lua flags=no-writes"
    + _PRELUDE
    + _LINE_OF
    + """
-- ARGV: count -> the head (gen seq link hh base size n), then the lines of the newest
--       `count` seqs, ascending, as LINES_AT gives them
local out = {c[1], c[2], c[3], c[4], c[5], c[6], c[7]}
local hi = tonumber(c[2])
for seq = math.max(1, hi - tonumber(ARGV[1]) + 1), hi do add(out, seq) end
return out
"""
)
