"""The PostgreSQL engine's schema: its tables, its server-side functions, its version.

Everything lives in one schema (default `eventstore`, chosen with `?schema=NAME` in the
URL), created on first use or by `eventstore init-db URL`, and versioned in `meta`.

Tables (one row per session in `sessions`, its head: the row every writer locks):

    sessions   sid, session_id, log_id (names the live log; new on every replacement),
               head_seq/head_link/head_h, base_seq, snap_seq (what the live log's
               opening snapshot covers, 0: none), snap_len, live_origin/stream_end
               (byte offsets in the session's stream of lines, for live-log offsets)
    lines      one row per appended line, its exact bytes (newline included), never
               edited (compaction without history, repair and removing the session
               delete rows; no foreign key, see version 5): sid, seq,
               stream_off, tx and pos (its place in the feed's order), feed_seq (its
               feed position, once released), line
    snapshots  every snapshot installed, in order (n); `line` NULL once the log it
               opened was replaced without keeping history
    caches     the face's fold caches: a state's bytes and the head it was folded to
    listeners  the backends that follow (appends NOTIFY only while one is registered)
    idempotency_keys  the key and request fingerprint of each keyed batch
    saved      bytes a repair dropped, saved aside first

The global feed (`PostgresEngine.feed`) orders every line of every session by (tx, pos):
`tx` is the appending transaction's id (`pg_current_xact_id()`, 64-bit, never wraps) and
`pos` a number from a sequence, increasing within a transaction. A line is *released*
once its `tx` is below the oldest transaction still running
(`pg_snapshot_xmin(pg_current_snapshot())`): every transaction below that horizon has
ended, committed or rolled back, so every line released later has a larger (tx, pos)
than every line released before, however long a writer's transaction was in flight.
The function `release` (called by `feed`, under one advisory lock) hands the lines
released since the last call their `feed_seq`, in (tx, pos) order: the position a reader
keeps. It is data, so it means the same after a pg_dump restore or logical replication
into another cluster, where transaction ids start over; `meta` records the cluster's
`system_identifier`, and the first open in another cluster numbers every line the old
one had not released (`release(true)`) before anything is appended there. The order
agrees with time: a transaction that commits before another begins gets a smaller id.
And it keeps each session's seq order: `append` takes a transaction-scoped advisory
lock on the session before anything gives it a transaction id, so the next append to
that session gets its id only after this one has committed. Writers never serialize on
anything global (commits of different sessions proceed in parallel and share WAL
flushes); the price is that a line reaches the feed only once every older writing
transaction on the server (in any database: transaction ids are server-wide) has
ended (`PostgresEngine.feed_blockers` names them).

Every value reaches the server as a parameter; the schema name, the only identifier
spliced into SQL, is checked against `SCHEMA_NAME` and quoted.
"""

from __future__ import annotations

import re
from typing import Any

from eventstore.errors import EventStoreError, InvalidArgumentError, StorageError

__all__ = [
    "SCHEMA_NAME",
    "SCHEMA_VERSION",
    "SchemaVersionError",
    "ddl",
    "quote_schema",
]

SCHEMA_VERSION = 5
"""The version of the tables and functions this code reads and writes."""

SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,39}")
"""Accepted schema names: lower-case identifiers short enough that the notification
channel (`<schema>_append`) stays under PostgreSQL's 63-byte identifier limit."""

# seeds the hash of a session id into the key of its advisory lock (any constant would do;
# a fixed one keeps every process agreeing)
SESSION_LOCK_SEED = 0x6576_7374

# taken (transaction-level) while feed positions are handed out, so they increase
RELEASE_LOCK_KEY = 0x6576_7374_5F66_6565  # "evst_fee"

# taken (session-level) while the schema is created or migrated, so concurrent
# first uses by many processes create it once
INIT_LOCK_KEY = 0x6576_7374_5F70_6731  # "evst_pg1"


class SchemaVersionError(EventStoreError):
    """The database holds an eventstore schema of a version this code does not read."""


def quote_schema(name: str) -> str:
    """The schema name as a quoted SQL identifier; InvalidArgumentError (a ValueError)
    for an unaccepted name."""
    if not SCHEMA_NAME.fullmatch(name):
        raise InvalidArgumentError(
            f"schema name {name!r} is not accepted: lower-case letters, digits and _,"
            " not starting with a digit, at most 40 characters"
        )
    return f'"{name}"'


def channel_of(name: str) -> str:
    """The LISTEN/NOTIFY channel of a schema (an identifier: `<schema>_append`)."""
    quote_schema(name)
    return f"{name}_append"


_DDL_V1 = """
CREATE SCHEMA IF NOT EXISTS @S;

CREATE TABLE @S.meta (
    name  text PRIMARY KEY,
    value text NOT NULL
);

CREATE SEQUENCE @S.log_ids;

CREATE SEQUENCE @S.line_pos;

CREATE TABLE @S.sessions (
    sid         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    session_id  text NOT NULL UNIQUE,
    log_id      bigint NOT NULL,
    head_seq    bigint NOT NULL DEFAULT 0,
    head_link   text NOT NULL DEFAULT '',
    head_h      text NOT NULL DEFAULT '',
    base_seq    bigint NOT NULL DEFAULT 0,
    snap_seq    bigint NOT NULL DEFAULT 0,
    snap_len    bigint NOT NULL DEFAULT 0,
    live_origin bigint NOT NULL DEFAULT 0,
    stream_end  bigint NOT NULL DEFAULT 0
);

CREATE TABLE @S.lines (
    sid        bigint NOT NULL REFERENCES @S.sessions ON DELETE CASCADE,
    seq        bigint NOT NULL,
    stream_off bigint NOT NULL,
    tx         xid8 NOT NULL DEFAULT pg_current_xact_id(),
    pos        bigint NOT NULL DEFAULT nextval('@S.line_pos'),
    line       bytea NOT NULL,
    PRIMARY KEY (sid, seq)
);
ALTER TABLE @S.lines ALTER COLUMN line SET STORAGE EXTERNAL;
CREATE UNIQUE INDEX lines_feed ON @S.lines (tx, pos);

CREATE TABLE @S.snapshots (
    n            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    sid          bigint NOT NULL REFERENCES @S.sessions ON DELETE CASCADE,
    seq          bigint NOT NULL,
    line         bytea,
    installed_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX snapshots_sid ON @S.snapshots (sid, n);

CREATE TABLE @S.idempotency_keys (
    sid         bigint NOT NULL REFERENCES @S.sessions ON DELETE CASCADE,
    key         text NOT NULL,
    fingerprint text,
    first_seq   bigint NOT NULL,
    last_seq    bigint NOT NULL,
    PRIMARY KEY (sid, key)
);

CREATE TABLE @S.saved (
    n        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    sid      bigint NOT NULL REFERENCES @S.sessions ON DELETE CASCADE,
    reason   text NOT NULL,
    data     bytea NOT NULL,
    saved_at timestamptz NOT NULL DEFAULT now()
);

-- One append, one transaction, one round trip. Returns the session's head after it
-- (moved = true: nothing was written, the head is the one found).
CREATE FUNCTION @S.append(
    p_session_id    text,
    p_expected_seq  bigint,
    p_expected_link text,
    p_first_seq     bigint,
    p_lines         bytea[],
    p_last_h        text,
    p_link          text,
    p_opening_snap  boolean,
    p_key           text,
    p_fingerprint   text
) RETURNS TABLE (
    moved boolean, log_id bigint, head_seq bigint, head_link text, head_h text,
    base_seq bigint, size bigint
) LANGUAGE plpgsql SET search_path = pg_catalog AS $fn$
DECLARE
    s       @S.sessions%ROWTYPE;
    n       int := cardinality(p_lines);
    nbytes  bigint;
    first   bigint := p_first_seq;
    snap    bytea;
    rest    bytea[] := p_lines;
BEGIN
    -- first, before anything assigns this transaction an id: see the feed order above
    PERFORM pg_advisory_xact_lock(hashtextextended(p_session_id, @K));
    SELECT * INTO s FROM @S.sessions WHERE session_id = p_session_id FOR UPDATE;
    IF NOT FOUND THEN
        IF p_expected_seq <> 0 OR p_expected_link <> '' THEN
            RETURN QUERY SELECT true, 0::bigint, 0::bigint, ''::text, ''::text,
                0::bigint, 0::bigint;
            RETURN;
        END IF;
        INSERT INTO @S.sessions (session_id, log_id)
            VALUES (p_session_id, nextval('@S.log_ids'))
            ON CONFLICT (session_id) DO NOTHING;
        SELECT * INTO s FROM @S.sessions WHERE session_id = p_session_id FOR UPDATE;
    END IF;
    IF s.head_seq <> p_expected_seq OR s.head_link <> p_expected_link THEN
        RETURN QUERY SELECT true, s.log_id, s.head_seq, s.head_link, s.head_h,
            s.base_seq, s.snap_len + s.stream_end - s.live_origin;
        RETURN;
    END IF;
    IF p_opening_snap THEN
        -- a log that opens with a snapshot (copied from a store compacted without
        -- history): the snapshot line is the live log's opening, lines follow it
        IF s.head_seq <> 0 THEN
            RAISE EXCEPTION 'an opening snapshot can only start an empty session';
        END IF;
        snap := p_lines[1];
        rest := p_lines[2:];
        INSERT INTO @S.snapshots (sid, seq, line) VALUES (s.sid, p_first_seq, snap);
        s.snap_seq := p_first_seq;
        s.base_seq := p_first_seq;
        s.snap_len := length(snap);
        first := p_first_seq + 1;
        n := n - 1;
    ELSIF p_first_seq <> p_expected_seq + 1 THEN
        RAISE EXCEPTION 'batch starts at seq % after head seq %', p_first_seq, p_expected_seq;
    ELSIF s.base_seq = 0 THEN
        s.base_seq := first;
    END IF;
    nbytes := coalesce((SELECT sum(length(l)) FROM unnest(rest) AS l), 0);
    INSERT INTO @S.lines (sid, seq, stream_off, line)
        SELECT s.sid, first + i - 1,
               s.stream_end + coalesce(sum(length(l)) OVER (ORDER BY i
                   ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0),
               l
        FROM unnest(rest) WITH ORDINALITY AS t(l, i) ORDER BY i;
    UPDATE @S.sessions SET
        head_seq = first + n - 1, head_link = p_link, head_h = p_last_h,
        base_seq = s.base_seq, snap_seq = s.snap_seq, snap_len = s.snap_len,
        stream_end = s.stream_end + nbytes
        WHERE sid = s.sid;
    IF p_key IS NOT NULL THEN
        INSERT INTO @S.idempotency_keys (sid, key, fingerprint, first_seq, last_seq)
            VALUES (s.sid, p_key, p_fingerprint, p_first_seq, first + n - 1)
            ON CONFLICT DO NOTHING;
    END IF;
    RETURN QUERY SELECT false, s.log_id, first + n - 1, p_link, p_last_h, s.base_seq,
        s.snap_len + s.stream_end + nbytes - s.live_origin;
END
$fn$;

-- Replace the live log by a snapshot line covering up to p_covers_seq (the lines after
-- it stay, unmoved). moved = true: the live log is no longer the one covered.
CREATE FUNCTION @S.install_snapshot(
    p_session_id text,
    p_log_id     bigint,
    p_covers_seq bigint,
    p_line       bytea,
    p_line_h     text,
    p_keep       boolean
) RETURNS TABLE (
    moved boolean, log_id bigint, head_seq bigint, head_link text, head_h text,
    base_seq bigint, size bigint, before bigint
) LANGUAGE plpgsql SET search_path = pg_catalog AS $fn$
DECLARE
    s        @S.sessions%ROWTYPE;
    covered  bigint;
    new_log  bigint;
    new_h    text;
BEGIN
    SELECT * INTO s FROM @S.sessions WHERE session_id = p_session_id FOR UPDATE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT true, 0::bigint, 0::bigint, ''::text, ''::text, 0::bigint,
            0::bigint, 0::bigint;
        RETURN;
    END IF;
    IF s.log_id <> p_log_id OR p_covers_seq > s.head_seq OR p_covers_seq < s.base_seq
       OR p_covers_seq < 1 THEN
        RETURN QUERY SELECT true, s.log_id, s.head_seq, s.head_link, s.head_h, s.base_seq,
            s.snap_len + s.stream_end - s.live_origin, 0::bigint;
        RETURN;
    END IF;
    covered := coalesce((SELECT sum(length(l.line)) FROM @S.lines l
        WHERE l.sid = s.sid AND l.seq > s.snap_seq AND l.seq <= p_covers_seq), 0);
    IF NOT p_keep THEN
        UPDATE @S.snapshots SET line = NULL
            WHERE sid = s.sid AND n = (SELECT max(n) FROM @S.snapshots WHERE sid = s.sid)
              AND s.snap_seq > 0;
        DELETE FROM @S.lines l
            WHERE l.sid = s.sid AND l.seq > s.snap_seq AND l.seq <= p_covers_seq;
    END IF;
    INSERT INTO @S.snapshots (sid, seq, line) VALUES (s.sid, p_covers_seq, p_line);
    new_log := nextval('@S.log_ids');
    new_h := CASE WHEN p_covers_seq = s.head_seq THEN p_line_h ELSE s.head_h END;
    UPDATE @S.sessions SET
        log_id = new_log, head_h = new_h, base_seq = p_covers_seq, snap_seq = p_covers_seq,
        snap_len = length(p_line), live_origin = s.live_origin + covered
        WHERE sid = s.sid;
    PERFORM pg_notify('@C', p_session_id);
    RETURN QUERY SELECT false, new_log, s.head_seq, s.head_link, new_h, p_covers_seq,
        length(p_line) + s.stream_end - s.live_origin - covered,
        s.snap_len + s.stream_end - s.live_origin;
END
$fn$;
"""

_DDL_V2 = """
-- Feed positions that are data: `feed_seq`, handed out in (tx, pos) order to the lines
-- released (every older transaction ended), so a position means the same after a
-- pg_dump restore or logical replication into another cluster, whose transaction ids
-- start over. The lines released under version 1 are numbered now.
ALTER TABLE @S.lines ADD COLUMN feed_seq bigint;
CREATE UNIQUE INDEX lines_feed_seq ON @S.lines (feed_seq);
CREATE INDEX lines_unreleased ON @S.lines (tx, pos) WHERE feed_seq IS NULL;
UPDATE @S.lines l SET feed_seq = r.n
    FROM (SELECT sid, seq, row_number() OVER (ORDER BY tx, pos) AS n FROM @S.lines
          WHERE tx < pg_snapshot_xmin(pg_current_snapshot())) r
    WHERE l.sid = r.sid AND l.seq = r.seq;

-- Hand out feed positions to the lines released since the last call (p_all: to every
-- line without one, in (tx, pos) order: the lines of another cluster, adopted).
CREATE FUNCTION @S.release(p_all boolean) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog AS $fn$
DECLARE
    horizon xid8;
    top     bigint;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM @S.lines WHERE feed_seq IS NULL
                   AND (p_all OR tx < pg_snapshot_xmin(pg_current_snapshot()))) THEN
        RETURN;
    END IF;
    PERFORM pg_advisory_xact_lock(@R);
    -- each statement below sees what the releaser before us committed
    horizon := pg_snapshot_xmin(pg_current_snapshot());
    top := coalesce((SELECT max(feed_seq) FROM @S.lines), 0);
    UPDATE @S.lines l SET feed_seq = top + r.n
        FROM (SELECT sid, seq, row_number() OVER (ORDER BY tx, pos) AS n FROM @S.lines
              WHERE feed_seq IS NULL AND (p_all OR tx < horizon)) r
        WHERE l.sid = r.sid AND l.seq = r.seq;
END
$fn$;

-- The feed after position p_after: positions handed out first, then up to p_limit
-- lines (k = 1); a first row (k = 0) says that committed lines are held back, and the
-- horizon holding them (the oldest transaction still open) as `session_id`.
CREATE FUNCTION @S.feed(p_after bigint, p_limit int) RETURNS TABLE (
    k int, feed_seq bigint, session_id text, seq bigint, line bytea
) LANGUAGE plpgsql SET search_path = pg_catalog AS $fn$
DECLARE
    horizon xid8;
BEGIN
    PERFORM @S.release(false);
    horizon := pg_snapshot_xmin(pg_current_snapshot());
    IF EXISTS (SELECT 1 FROM @S.lines l WHERE l.feed_seq IS NULL AND l.tx >= horizon) THEN
        RETURN QUERY SELECT 0, NULL::bigint, horizon::text, NULL::bigint, NULL::bytea;
    END IF;
    RETURN QUERY SELECT 1, l.feed_seq, s.session_id, l.seq, l.line
        FROM @S.lines l JOIN @S.sessions s USING (sid)
        WHERE l.feed_seq > p_after ORDER BY l.feed_seq LIMIT p_limit;
END
$fn$;
"""


def _append_v3() -> str:
    """Version 1's `append`, waking followers itself: in its own transaction (one
    transaction and one round trip per append, the NOTIFY delivered at its commit) and
    only when a backend follows (`listeners`), since a notifying commit serializes with
    every other notifying commit on the server (a global lock held through the WAL
    flush)."""
    start = _DDL_V1.index("CREATE FUNCTION @S.append(")
    body = _DDL_V1[start : _DDL_V1.index("$fn$;", start) + len("$fn$;")]
    last = body.rindex("    RETURN QUERY SELECT false,")
    wake = (
        "    -- last: the lock this read takes on `listeners` is held to the commit, so a\n"
        "    -- follower registering (listen()) waits for this append to commit or sees it\n"
        "    IF EXISTS (SELECT 1 FROM @S.listeners) THEN\n"
        "        PERFORM pg_notify('@C', p_session_id);\n"
        "    END IF;\n"
    )
    body = body[:last] + wake + body[last:]
    return body.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)


_DDL_V3 = """
-- The backends that follow (LISTEN on the channel), by pid: an append notifies only when
-- one is registered. A follower LISTENs, then calls listen(), whose lock waits for every
-- append that looked at this table before: each append either committed before the
-- follower reads, or notifies at its commit. A row of a backend that died without
-- unlisten() costs appends their NOTIFY until the next listen() clears it.
CREATE TABLE @S.listeners (
    pid   int PRIMARY KEY,
    since timestamptz NOT NULL DEFAULT now()
);

CREATE FUNCTION @S.listen() RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog AS $fn$
BEGIN
    LOCK TABLE @S.listeners IN ACCESS EXCLUSIVE MODE;
    DELETE FROM @S.listeners WHERE pid NOT IN (SELECT a.pid FROM pg_stat_activity a);
    INSERT INTO @S.listeners (pid) VALUES (pg_backend_pid()) ON CONFLICT DO NOTHING;
END
$fn$;

CREATE FUNCTION @S.unlisten() RETURNS void
LANGUAGE sql SET search_path = pg_catalog AS $fn$
    DELETE FROM @S.listeners WHERE pid = pg_backend_pid();
$fn$;

-- Fewer index entries per appended line (WAL records per append): the unique index on
-- (tx, pos) served only lookups of version-1 feed positions (rare: they scan now), and
-- a line's feed_seq is NULL until it is released, so its index holds released lines only.
DROP INDEX @S.lines_feed;
DROP INDEX @S.lines_feed_seq;
CREATE UNIQUE INDEX lines_feed_seq ON @S.lines (feed_seq) WHERE feed_seq IS NOT NULL;

-- The face's fold caches and checked prefixes (`CachingEngine`): a state's bytes and the
-- head it was folded to, given back only while that head is a point of the live log
-- (the same log_id: every replacement of the live log takes a new one). Not compressed:
-- a cold load reads it whole, and the face's bytes are dense already.
CREATE TABLE @S.caches (
    sid      bigint NOT NULL REFERENCES @S.sessions ON DELETE CASCADE,
    name     text NOT NULL,
    log_id   bigint NOT NULL,
    seq      bigint NOT NULL,
    link     text NOT NULL,
    h        text NOT NULL,
    base_seq bigint NOT NULL,
    size     bigint NOT NULL,
    data     bytea NOT NULL,
    PRIMARY KEY (sid, name)
);
ALTER TABLE @S.caches ALTER COLUMN data SET STORAGE EXTERNAL;
""" + _append_v3()


def _append_v4() -> str:
    """Version 3's `append` with the session index's columns written in the same
    statement as the head: the batch's time (the server's clock when it carries none)
    and the labels it sets. Derived from version 3's text, so the two never drift."""
    body = _append_v3().replace("CREATE OR REPLACE FUNCTION", "CREATE FUNCTION", 1)
    body = body.replace(
        "    p_fingerprint   text\n) RETURNS",
        "    p_fingerprint   text,\n    p_ts_us         bigint DEFAULT 0,\n"
        "    p_labels        jsonb DEFAULT NULL\n) RETURNS",
    )
    body = body.replace(
        "        stream_end = s.stream_end + nbytes\n        WHERE sid = s.sid;",
        "        stream_end = s.stream_end + nbytes,\n"
        "        created_us = CASE WHEN s.head_seq = 0 THEN ts ELSE s.created_us END,\n"
        "        updated_us = greatest(s.updated_us, ts),\n"
        "        labels = coalesce(p_labels, s.labels)\n"
        "        WHERE sid = s.sid;",
    )
    body = body.replace(
        "    rest    bytea[] := p_lines;\nBEGIN",
        "    rest    bytea[] := p_lines;\n"
        "    ts      bigint := CASE WHEN p_ts_us > 0 THEN p_ts_us\n"
        "                ELSE (extract(epoch FROM clock_timestamp()) * 1000000)::bigint END;\n"
        "BEGIN",
    )
    assert body.count("p_ts_us") == 3 and "labels = coalesce" in body  # the patches took
    return body


_DDL_V4 = (
    """
-- The session index (`IndexingEngine`): times and labels beside each session's head,
-- written by `append` in its own statement; ordered pages read the indexes below. A
-- store that had sessions before is marked for a rebuild from its logs (`index_stale`).
ALTER TABLE @S.sessions
    ADD COLUMN created_us bigint NOT NULL DEFAULT 0,
    ADD COLUMN updated_us bigint NOT NULL DEFAULT 0,
    ADD COLUMN labels jsonb NOT NULL DEFAULT '{}';
CREATE INDEX sessions_updated ON @S.sessions (updated_us, session_id);
CREATE INDEX sessions_created ON @S.sessions (created_us, session_id);
INSERT INTO @S.meta (name, value)
    SELECT 'index_stale', '1' WHERE EXISTS (SELECT 1 FROM @S.sessions);
DROP FUNCTION @S.append(text, bigint, text, bigint, bytea[], text, text, boolean, text, text);
"""
    + _append_v4()
    + "\n"
)

_DDL_V5 = """
-- `lines` keeps no foreign key to `sessions`: its check locked the session's row once
-- more for every line appended (a WAL record each), and the one statement that relied
-- on its cascade, removing a session, deletes the session's lines itself (under the
-- session's row lock, so no append adds one meanwhile).
DO $do$
DECLARE
    c text;
BEGIN
    FOR c IN SELECT conname FROM pg_constraint
             WHERE conrelid = '@S.lines'::regclass AND contype = 'f' LOOP
        EXECUTE format('ALTER TABLE @S.lines DROP CONSTRAINT %I', c);
    END LOOP;
END
$do$;

-- Version 4's `append` (same arguments, same answers, same locks in the same order), its
-- common case in one statement after the advisory lock: when the head is the expected
-- one and the batch follows it, one UPDATE moves the head (taking the row lock itself:
-- no SELECT ... FOR UPDATE before it, one WAL record less), and in the same statement
-- inserts the lines and the idempotency key and asks whether anyone follows (each
-- statement of a function costs an executor run, tens of microseconds). Anything else
-- (a new session, an opening snapshot, a moved head, a batch that does not follow)
-- takes version 4's path, unchanged below it.
CREATE OR REPLACE FUNCTION @S.append(
    p_session_id    text,
    p_expected_seq  bigint,
    p_expected_link text,
    p_first_seq     bigint,
    p_lines         bytea[],
    p_last_h        text,
    p_link          text,
    p_opening_snap  boolean,
    p_key           text,
    p_fingerprint   text,
    p_ts_us         bigint DEFAULT 0,
    p_labels        jsonb DEFAULT NULL
) RETURNS TABLE (
    moved boolean, log_id bigint, head_seq bigint, head_link text, head_h text,
    base_seq bigint, size bigint
) LANGUAGE plpgsql SET search_path = pg_catalog AS $fn$
DECLARE
    s       @S.sessions%ROWTYPE;
    n       int := cardinality(p_lines);
    nbytes  bigint;
    first   bigint := p_first_seq;
    snap    bytea;
    rest    bytea[] := p_lines;
    ts      bigint := CASE WHEN p_ts_us > 0 THEN p_ts_us
                ELSE (extract(epoch FROM clock_timestamp()) * 1000000)::bigint END;
    live    bigint;
    wake    boolean;
BEGIN
    -- first, before anything assigns this transaction an id: see the feed order above
    PERFORM pg_advisory_xact_lock(hashtextextended(p_session_id, @K));
    IF NOT p_opening_snap AND p_first_seq = p_expected_seq + 1 AND n > 0 THEN
        -- under the advisory lock no other append moves this head meanwhile; a
        -- compaction or repair that does is waited for by the row lock, and the WHERE
        -- is checked again on the row it left. The listeners' lock, taken with the
        -- statement's others, is held to the commit: a follower registering (listen())
        -- waits for this append to commit, or is seen by it.
        WITH u AS (
            UPDATE @S.sessions AS t SET
                head_seq = p_first_seq + n - 1, head_link = p_link, head_h = p_last_h,
                base_seq = CASE WHEN t.base_seq = 0 THEN p_first_seq ELSE t.base_seq END,
                stream_end = t.stream_end + (SELECT sum(octet_length(x)) FROM unnest(p_lines) x),
                created_us = CASE WHEN t.head_seq = 0 THEN ts ELSE t.created_us END,
                updated_us = greatest(t.updated_us, ts),
                labels = coalesce(p_labels, t.labels)
            WHERE t.session_id = p_session_id AND t.head_seq = p_expected_seq
              AND t.head_link = p_expected_link
            RETURNING t.sid, t.log_id, t.base_seq, t.snap_len, t.live_origin, t.stream_end
        ), ins AS (
            INSERT INTO @S.lines (sid, seq, stream_off, line)
                SELECT u.sid, p_first_seq + x.i - 1,
                       u.stream_end - sum(octet_length(x.l)) OVER (ORDER BY x.i
                           ROWS BETWEEN CURRENT ROW AND UNBOUNDED FOLLOWING),
                       x.l
                FROM u, unnest(p_lines) WITH ORDINALITY AS x(l, i) ORDER BY x.i
        ), k AS (
            INSERT INTO @S.idempotency_keys (sid, key, fingerprint, first_seq, last_seq)
                SELECT u.sid, p_key, p_fingerprint, p_first_seq, p_first_seq + n - 1
                FROM u WHERE p_key IS NOT NULL
                ON CONFLICT DO NOTHING
        )
        SELECT u.log_id, u.base_seq, u.snap_len + u.stream_end - u.live_origin,
               EXISTS (SELECT 1 FROM @S.listeners)
            FROM u INTO s.log_id, s.base_seq, live, wake;
        IF FOUND THEN
            IF wake THEN
                PERFORM pg_notify('@C', p_session_id);
            END IF;
            moved := false;
            log_id := s.log_id;
            head_seq := p_first_seq + n - 1;
            head_link := p_link;
            head_h := p_last_h;
            base_seq := s.base_seq;
            size := live;
            RETURN NEXT;
            RETURN;
        END IF;
    END IF;
@SLOW"""


def _ddl_v5() -> str:
    """Version 5's `append`: its fast path above, then version 4's body from its row
    lock on (the slow path), taken from version 4's text so the two never drift."""
    v4 = _append_v4()
    start = v4.index(
        "    SELECT * INTO s FROM @S.sessions WHERE session_id = p_session_id FOR UPDATE;"
    )
    return _DDL_V5.replace("@SLOW", v4[start:]) + "\n"


_MIGRATIONS: dict[int, str] = {
    1: _DDL_V1, 2: _DDL_V2, 3: _DDL_V3, 4: _DDL_V4, 5: _ddl_v5(),
}  # fmt: skip
"""version -> the SQL that brings the schema from version - 1 to it."""


def ddl(schema: str, version: int) -> str:
    """The SQL that brings `schema` from `version - 1` to `version`."""
    quoted = quote_schema(schema)
    return (
        _MIGRATIONS[version]
        .replace("@S", quoted)
        .replace("@C", channel_of(schema))
        .replace("@K", str(SESSION_LOCK_SEED))
        .replace("@R", str(RELEASE_LOCK_KEY))
    )


def ensure_schema(conn: Any, schema: str, *, create: bool = True) -> int:
    """Create or migrate the schema to SCHEMA_VERSION on `conn` (an autocommit psycopg
    connection); returns the version found before (0: none). Safe when many processes
    race: the work runs under a transaction-scoped advisory lock.

    Raises SchemaVersionError if the database's schema is newer than this code's, or
    older and not `create`, and StorageError if there is none and not `create` (a
    reader's open writes nothing: it neither makes, upgrades nor adopts a store, which
    a read-only role could not do either).
    """
    import psycopg

    quoted = quote_schema(schema)
    if _current(conn, quoted):
        return SCHEMA_VERSION
    found = _version(conn, quoted)
    if found == SCHEMA_VERSION:
        if create:
            _adopt_if_moved(conn, quoted)
        return found
    if found == 0 and not create:
        raise StorageError(f"no store in schema {schema!r}: it holds no eventstore tables")
    if found > SCHEMA_VERSION:
        raise SchemaVersionError(
            f"the database's eventstore schema {schema!r} is at version {found}; this"
            f" eventstore reads version {SCHEMA_VERSION}: upgrade eventstore"
        )
    if not create:  # (this code reads only its own version's tables and functions)
        raise SchemaVersionError(
            f"the database's eventstore schema {schema!r} is at version {found}; this"
            f" eventstore reads version {SCHEMA_VERSION}, and an open with create=False"
            " writes nothing, so it does not upgrade it: upgrade it once with a role"
            " that may alter the schema, by opening it with create=True or"
            " `eventstore init-db URL`"
        )
    # a session-level lock taken before the transaction starts: a transaction that began
    # before another process committed the schema would still see its catalog as it was
    conn.execute("SELECT pg_advisory_lock(%s)", (INIT_LOCK_KEY,))
    try:
        with conn.transaction():
            found = _version(conn, quoted)  # another process may have done it meanwhile
            for version in range(found + 1, SCHEMA_VERSION + 1):
                conn.execute(psycopg.sql.SQL(ddl(schema, version)))
                conn.execute(
                    psycopg.sql.SQL(
                        "INSERT INTO {}.meta (name, value) VALUES ('schema_version', %s)"
                        " ON CONFLICT (name) DO UPDATE SET value = EXCLUDED.value"
                    ).format(psycopg.sql.Identifier(schema)),
                    (str(version),),
                )
    finally:
        conn.execute("SELECT pg_advisory_unlock(%s)", (INIT_LOCK_KEY,))
    _adopt_if_moved(conn, quoted)
    return found


def _current(conn: Any, quoted: str) -> bool:
    """Whether the schema is at SCHEMA_VERSION and was last opened in this cluster, in
    one round trip (every open of a store asks; the answer is almost always yes). False
    whenever in doubt: the careful path then looks again, step by step."""
    import psycopg

    try:
        row = conn.execute(
            f"SELECT (SELECT value FROM {quoted}.meta WHERE name = 'schema_version'),"  # noqa: S608
            f" (SELECT value FROM {quoted}.meta WHERE name = 'cluster'),"
            " (SELECT system_identifier::text FROM pg_control_system())"
        ).fetchone()
    except psycopg.Error:  # no schema yet, or no right to read the control data
        return False
    return row is not None and row[0] == str(SCHEMA_VERSION) and row[1] == row[2] is not None


def _adopt_if_moved(conn: Any, quoted: str) -> None:
    """Record the server's `system_identifier` in `meta`; when it names another
    cluster (the schema came by pg_dump or logical replication), first hand out feed
    positions to every line without one: the old cluster's lines, all committed, whose
    transaction ids mean nothing here (they come before anything written here)."""
    import psycopg

    try:
        here = conn.execute("SELECT system_identifier::text FROM pg_control_system()").fetchone()
    except psycopg.errors.InsufficientPrivilege:  # pragma: no cover - a locked-down server
        return
    if _cluster(conn, quoted) == here[0]:
        return
    conn.execute("SELECT pg_advisory_lock(%s)", (INIT_LOCK_KEY,))
    try:
        with conn.transaction():
            before = _cluster(conn, quoted)  # another process may have done it meanwhile
            if before == here[0]:
                return
            if before is not None:
                conn.execute(f"SELECT {quoted}.release(true)")
            conn.execute(
                f"INSERT INTO {quoted}.meta (name, value) VALUES ('cluster', %s)"  # noqa: S608
                " ON CONFLICT (name) DO UPDATE SET value = EXCLUDED.value",
                (here[0],),
            )
    finally:
        conn.execute("SELECT pg_advisory_unlock(%s)", (INIT_LOCK_KEY,))


def _cluster(conn: Any, quoted: str) -> str | None:
    """The `system_identifier` of the cluster the schema was last opened in."""
    row = conn.execute(
        f"SELECT value FROM {quoted}.meta WHERE name = 'cluster'"  # noqa: S608
    ).fetchone()
    return None if row is None else str(row[0])


def _version(conn: Any, quoted: str) -> int:
    """The schema version recorded in the database (0: no eventstore schema there)."""
    row = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (f"{quoted}.meta",)).fetchone()
    if not row[0]:
        return 0
    row = conn.execute(
        f"SELECT value FROM {quoted}.meta WHERE name = 'schema_version'"  # noqa: S608
    ).fetchone()
    return int(row[0]) if row else 0
