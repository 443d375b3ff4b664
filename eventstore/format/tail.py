"""Where a log's committed lines end: the last complete batch of a run of log bytes.

Bytes after it are a torn tail: a partial last line, a batch without its closing line,
or a batch holding a hole of zeros. Read by envelopes only (`HEAD_DECODER`), so it is
cheap enough for every read of a log's end: the file engine finds its head with it, and
the careful line reader (`eventstore.format.reader`) agrees with it on what is torn.
"""

from __future__ import annotations

import msgspec

from eventstore.errors import CorruptLogError
from eventstore.format.depth import HEAD_DECODER
from eventstore.format.events import LineHead, SnapshotHead

__all__ = ["committed_end", "snapshot_line_head"]


def committed_end(
    buf: bytes,
    where: str,
    start: int,
    first: tuple[SnapshotHead, str] | None = None,
    *,
    at_boundary: bool = True,
) -> tuple[int, LineHead | None]:
    """The end of the last complete batch in `buf` and its closing line's envelope.

    Walks back from the last newline over lines whose batch is not closed (`more` > 0):
    usually one envelope decode. Blank lines hold nothing. `first`: the header of the
    snapshot that opens the log, when `buf` reaches back to it (its envelope, not decoded).

    A batch holding a NUL byte is torn too: a committed line never holds one (JSON
    escapes it), but a power loss during a multi-block append may keep its later blocks
    and not its first, a hole of zeros before an intact closing line. Only when `buf`
    holds a NUL is the last batch walked back to the line that closes the one before it.
    `at_boundary`: `buf` starts where a batch starts (else a batch running off its start
    is not known whole: (0, None), the caller reads further back).
    """
    end = buf.rfind(b"\n")
    hole = buf.rfind(b"\0", 0, max(end, 0))
    found: tuple[int, LineHead] | None = None
    while end >= 0:
        if first is not None and start + end == first[0].length:
            return found or (end + 1, snapshot_line_head(first))  # no scan of a snapshot
        prev = buf.rfind(b"\n", 0, end)
        line = buf[prev + 1 : end]
        if hole > prev:  # this line holds a hole: it and its batch are torn
            found, hole = None, buf.rfind(b"\0", 0, prev + 1)
        elif line.strip():
            try:
                head = HEAD_DECODER.decode(line)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                raise CorruptLogError(
                    where, start + prev + 1, None, f"undecodable line: {exc}"
                ) from None
            if head.more == 0:
                if found is not None or hole < 0:
                    return found or (end + 1, head)
                found = (end + 1, head)  # whole unless a hole is found before its start
        end = prev
    if found is not None and at_boundary:
        return found
    return 0, None


def snapshot_line_head(first: tuple[SnapshotHead, str]) -> LineHead:
    """The envelope of an opening snapshot's line, from its header and `h`."""
    snap, h = first
    return LineHead(type="snapshot", seq=snap.seq, ts=snap.ts, h=h, base_h=snap.base_h)
