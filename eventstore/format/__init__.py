"""The log format: event types, the line codec, the hash chain, and the line reader.

    events.py   the event types (a msgspec tagged union), the envelopes LineHead and SnapshotHead
    chain.py    the hash chain (line_hash, link_of, hash_checks) and a line's fixed byte shapes
    codec.py    EventCodec: events to lines and back (batches, upcasting, checked encoding)
    depth.py    the nesting-depth limit of a line (MAX_DEPTH), and the envelope decoder of any line
    lines.py    the reader's line level: split, decode exactly, check one line's hash link
    reader.py   the reader's batch level: read_lines, sequence, batches, torn tails, reporters

Nothing here does I/O or knows about engines, sessions or stores (see docs/log-format.md).
"""
