"""The one line codec: events to log lines and back, for one set of event types.

`EventCodec.encode_batch` stamps a batch of events (sequence numbers, time, idempotency
key, version) and encodes each as one line closed by its hash (`eventstore.format.chain`).
Every line but the last of a multi-event append carries `more` (how many lines of its
batch follow); a line with `more` absent (0) closes a batch, and lines after the last
closing line are a torn batch. Decoding is by the types a caller needs (the others
become bare envelopes), upcasting lines written at an older version of their type, and
keeping a line of an unknown type verbatim (`UnknownEvent`).

Also here: what makes a value storable as given (`validated_copy`, `NotAsStoredError`):
nothing is stored that would read back different.
"""

from __future__ import annotations

import hashlib
import types
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import Any, Protocol, TypeVar

import msgspec

from eventstore.errors import (
    CorruptLogError,
    EventStoreError,
    InvalidRecordError,
    NestingTooDeepError,
)
from eventstore.format.chain import link_of, locate_states
from eventstore.format.crypt import (
    ENC_MARK,
    KEYLESS_TYPES,
    PLAIN_STATES,
    DataKey,
    decrypt_line,
    decrypt_lines,
    decrypt_states,
    encrypt_body,
    encrypt_states,
    encrypted_key_id,
    line_tag,
    states_encrypted,
    tags_in,
)
from eventstore.format.depth import (
    HEAD_DECODER,
    MAX_DEPTH,
    SNAPSHOT_MAX_DEPTH,
    check_depth,
    depth_of,
    over,
    too_deep_reason,
)
from eventstore.format.events import (
    BUILTIN_EVENT_TYPES,
    Event,
    MessagesAppended,
    Snapshot,
    UnknownEvent,
    Upcaster,
    event_tag,
)
from eventstore.records import Message, Role

__all__ = ["EventCodec", "LineDecoder", "NotAsStoredError", "Opener", "validated_copy"]

# the envelope of a line (beside `v`, which `upcast` sets to the version it reaches)
_ENVELOPE_FIELDS = ("type", "seq", "ts", "more", "key", "h")

_T = TypeVar("_T")
_json_encoder = msgspec.json.Encoder()
_blake2b = hashlib.blake2b
_replace = msgspec.structs.replace


Opener = Callable[[str], DataKey]
"""Gives the data key of a data key id (`eventstore.format.crypt`), or raises
KeyMissingError / KeyForgottenError / WrongKeyError naming it."""


class LineDecoder(Protocol):
    """What `EventCodec.decoder` gives: decodes many lines (or one) to events."""

    def decode_lines(self, buf: bytes | memoryview, /) -> list[Event]:
        """Each line of `buf` decoded."""
        ...

    def decrypt_snapshot(self, snap: Snapshot, /) -> None:
        """Open `snap`'s encrypted states in place (see `eventstore.format.crypt`)."""
        ...

    def decode(self, buf: bytes | memoryview, /) -> Event:
        """One line decoded."""
        ...


class _PlainDecoder(Protocol):
    """What `_DecryptingDecoder` decodes plain lines with: a msgspec decoder, or
    `_Widening`."""

    def decode_lines(self, buf: bytes, /) -> list[Event]: ...

    def decode(self, buf: bytes, /) -> Event: ...


class _Widening:
    """The decoder of a set of needed types, widened only when a line asks for it.

    Building a type into a decoder costs ~20-80 us the first time in a process (msgspec
    reads its annotations): most of the first fold of a fresh process after a fold
    cache, whose few lines hold a type or two. So the first decoder is of the needed
    types the first lines decoded hold (when they are few: `_GUESS_LINES`), then of
    every needed type (snapshots and tombstones always), then of every type, the others
    as stubs (made then, ~30 us a type; LangGraph's: 12 stubs, ~0.3 ms). The events
    decoded are the same either way: a ValidationError (a line of a type not in this
    decoder, or an invalid one) moves it to the next decoder for good; an invalid line
    then fails in the widest, as it would have."""

    __slots__ = ("_codec", "_key", "_now")

    def __init__(self, codec: EventCodec, key: frozenset[str]) -> None:
        self._codec, self._key = codec, key
        # (tier, its decoder), replaced whole: threads may widen it at once
        self._now: tuple[int, msgspec.json.Decoder[Event]] | None = None

    def _made(self, tier: int, tags: frozenset[str] = frozenset()) -> msgspec.json.Decoder[Event]:
        """The decoder of `tier`: 0 of `tags`, 1 of the needed types, 2 of every type."""
        known, key = self._codec.types, self._key
        if tier == 0:
            types = [known[t] for t in tags]
        elif tier == 1:
            types = [c for t, c in known.items() if t in key]
        else:
            stub = self._codec._stub
            types = [c if t in key else stub(t) for t, c in known.items()]
        return _union_decoder(types)

    def _first(self, buf: bytes) -> tuple[int, msgspec.json.Decoder[Event]]:
        """The first decoder, of the types `buf`'s lines hold if they are few and all
        needed, else of every needed type."""
        tier, tags = 1, frozenset[str]()
        if buf.count(b"\n") <= _GUESS_LINES:
            tags = _tags_of(buf)
            if tags and tags <= self._key and tags <= self._codec.types.keys():
                tier = 0
        now = self._now = (tier, self._made(tier, tags))
        return now

    def decode_lines(self, buf: bytes, /) -> list[Event]:
        return self._with(buf, msgspec.json.Decoder.decode_lines)

    def decode(self, buf: bytes, /) -> Event:
        return self._with(buf, msgspec.json.Decoder.decode)

    def _with(self, buf: bytes, call: Callable[[msgspec.json.Decoder[Event], bytes], _T]) -> _T:
        tier, dec = self._now or self._first(buf)
        while True:
            try:
                return call(dec, buf)
            except msgspec.ValidationError:
                if tier == 2:
                    raise
                now = self._now
                if now is not None and now[0] > tier:  # (another thread widened it meanwhile)
                    tier, dec = now
                else:
                    tier += 1
                    dec = self._made(tier)
                    self._now = (tier, dec)


# the most lines whose types choose a needed types decoder's first types (`_Widening`)
_GUESS_LINES = 64


def _tags_of(buf: bytes) -> frozenset[str]:
    """The `type`s of the lines of `buf` as the codec writes them (`line_tag`)."""
    return frozenset(line_tag(line).decode("utf-8", "replace") for line in buf.split(b"\n") if line)


class _DecryptingDecoder:
    """A decoder that opens the encrypted lines it must decode first (see `EventCodec.decoder`).

    A region without an encrypted line (a plain session's) goes to msgspec as it is: the
    cost for a store of plain sessions is one substring search per region."""

    __slots__ = ("_codec", "_inner", "_keyless", "_lenient", "_needed")

    def __init__(
        self,
        codec: EventCodec,
        inner: _PlainDecoder,
        needed: frozenset[bytes] | None,
        lenient: bool,
        keyless: bool = False,
    ) -> None:
        self._codec, self._inner, self._needed, self._lenient = codec, inner, needed, lenient
        self._keyless = keyless  # a decode for the lifecycle alone: other states unopened

    def _wanted(self, line: bytes) -> bool:
        return self._needed is None or line_tag(line) in self._needed

    def decode_lines(self, buf: bytes | memoryview, /) -> list[Event]:
        data = bytes(buf) if isinstance(buf, memoryview) else buf
        if ENC_MARK not in data:
            events = self._inner.decode_lines(data)
        elif self._lenient:
            events = [self.decode(line) for line in data.split(b"\n") if line.strip()]
        else:
            events = self._inner.decode_lines(decrypt_lines(data, self._codec.key_of, self._wanted))
        if events and type(events[0]) is Snapshot:  # (a snapshot only ever opens a log)
            self.decrypt_snapshot(events[0])
        return events

    def decode(self, buf: bytes | memoryview, /) -> Event:
        line = bytes(buf).rstrip(b"\n")
        if ENC_MARK in line and self._wanted(line):
            if self._lenient and not self._codec.can_decrypt(line):
                return self._codec.envelope_of(line)
            line = decrypt_line(line, self._codec.key_of)
        ev = self._inner.decode(line)
        if type(ev) is Snapshot:
            self.decrypt_snapshot(ev)
        return ev

    def decrypt_snapshot(self, snap: Snapshot, /) -> None:
        states = snap.states
        if self._keyless:  # a fold of the lifecycle alone: its state is kept plain
            states = {n: raw for n, raw in states.items() if n in PLAIN_STATES}
        if states and states_encrypted(states):  # (a lifecycle encrypted by older code too)
            try:
                opened = decrypt_states(states, snap.seq, snap.base_h, self._codec.key_of)
                snap.states = {**snap.states, **opened}
            except EventStoreError:
                if not self._lenient:
                    raise  # (lenient: verify checks a snapshot it cannot open by its chain)


def _union_decoder(members: list[type[Event]]) -> msgspec.json.Decoder[Event]:
    """A decoder of the tagged union of `members`."""
    union = members[0]
    for m in members[1:]:
        union = union | m  # type: ignore[assignment]
    return msgspec.json.Decoder(union)


class NotAsStoredError(InvalidRecordError):
    """An event given to `EventCodec.encode_batch(check=True)` would not read back equal
    (or cannot be encoded). The store runs `validated_copy` on its records, which names
    the field, and raises that instead."""


def validated_copy(value: object, cls: type[_T], what: str, *, max_depth: int = MAX_DEPTH) -> _T:
    """A private deep copy of `value` as it will read back from the log.

    Raises InvalidRecordError if `value` is not a `cls`, a field has the wrong type, or
    the value would not read back equal (a str where an enum belongs, bytes where text
    belongs, a UTC offset with seconds, which JSON timestamps cannot carry): nothing is
    ever stored that would come back different. NestingTooDeepError (one of them) if it
    nests deeper than `max_depth` levels of arrays and objects (its line, with the
    envelope, is held to `MAX_DEPTH`: a caller that knows where the value will stand in
    its line passes what is left).
    """
    if not isinstance(value, cls):
        raise InvalidRecordError(f"{what} must be a {cls.__name__}, got {type(value).__name__}")
    try:
        data = _json_encoder.encode(value)
    except RecursionError:  # deeper than the encoder can go from here: far past the limit
        raise _too_deep(what) from None
    except (msgspec.EncodeError, TypeError) as exc:
        raise InvalidRecordError(f"invalid {what}: {exc}") from None
    except UnicodeEncodeError as exc:  # a lone surrogate: no UTF-8 line can carry it
        raise _lone_surrogate(what, exc) from None
    check_depth(data, what, max_depth)
    _check_one_line(data, what)
    try:
        copy = msgspec.json.decode(data, type=cls)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:  # (DecodeError: a Raw)
        raise InvalidRecordError(f"invalid {what}: {exc}") from None
    if copy != value:
        where, given, stored = _first_difference(value, copy, what)
        raise InvalidRecordError(
            f"invalid {where}: {given!r} ({type(given).__name__}) would read back as"
            f" {stored!r}; give the declared type"
        )
    return copy


def _check_one_line(data: bytes, what: str) -> None:
    """InvalidRecordError if the JSON of `what` holds a newline: only a `msgspec.Raw`,
    written verbatim, can put one there, and it would split its log line in two."""
    if b"\n" in data:
        raise InvalidRecordError(
            f"invalid {what}: its JSON holds a newline (a msgspec.Raw is written verbatim"
            " and a log line is one line); give it without line breaks"
        )


# the types every fold must see whole, whatever it reads
_ALWAYS_DECODED = frozenset({"snapshot", "session_deleted"})


def _check_snapshot_depth(line: bytes, layout: dict[str, tuple[int, int]]) -> None:
    """NestingTooDeepError naming the deepest state if the snapshot `line` nests deeper
    than `SNAPSHOT_MAX_DEPTH` (no reader could be sure to decode it)."""
    if not over(line, SNAPSHOT_MAX_DEPTH):
        return
    depths = {name: depth_of(line[a:b]) for name, (a, b) in layout.items()}
    name = max(depths, key=depths.__getitem__, default="")
    raise NestingTooDeepError(
        f"a snapshot would nest {depth_of(line)} levels of arrays and objects deep (the"
        f" state of projection {name!r} nests {depths.get(name, 0)}); a snapshot may nest"
        f" at most {SNAPSHOT_MAX_DEPTH} (eventstore.format.depth.SNAPSHOT_MAX_DEPTH):"
        " nothing was written"
    )


def _lone_surrogate(what: str, exc: UnicodeEncodeError) -> InvalidRecordError:
    return InvalidRecordError(
        f"invalid {what}: {exc.object[exc.start : exc.end]!r} in {exc.object!r} is not"
        " encodable as UTF-8 (lone surrogate)"
    )


def _too_deep(what: str) -> NestingTooDeepError:
    return NestingTooDeepError(
        f"{what} nests arrays and objects too deep to encode; a log line may nest at most"
        f" {MAX_DEPTH} levels (eventstore.format.depth.MAX_DEPTH), its envelope included"
    )


# The empty `blocks` and `metadata` of every plain message's private copy: shared, and
# never changed. Stored states are handed out only as copies (`copy_message` gives each
# its own empty ones), so a copy costs one object, and a transcript kept in memory holds
# nothing the cyclic collector walks (an empty list is tracked, a Message is not).
_NO_BLOCKS: list[Any] = []
_NO_METADATA: dict[str, Any] = {}


def _plain_copies(ev: Event) -> list[Message] | None:
    """Private copies of the event's messages when every one is plain text (a `Role`,
    exact `str` content and name, an empty list and dict, nothing else), else None.
    Such a message reads back equal whenever it encodes (a lone surrogate does not), so
    it needs no round trip: a copy holding the shared empty containers is the private
    copy. The fast case of `encode_batch(check=True)`; the round trip judges every
    other message."""
    copies = []
    for m in ev.messages:  # type: ignore[attr-defined]
        if (
            type(m) is not Message
            or type(m.role) is not Role
            or type(m.content) is not str
            or (m.name is not None and type(m.name) is not str)
            or m.created_at is not None
            or type(m.blocks) is not list
            or m.blocks
            or type(m.metadata) is not dict
            or m.metadata
        ):
            return None
        copies.append(_replace(m, blocks=_NO_BLOCKS, metadata=_NO_METADATA))
    return copies


def _first_difference(given: Any, stored: Any, path: str) -> tuple[str, Any, Any]:
    """The path of the first value that differs between `given` and its round trip."""
    if isinstance(given, msgspec.Struct) and type(given) is type(stored):
        for name in given.__struct_fields__:
            a, b = getattr(given, name), getattr(stored, name)
            if a != b or type(a) is not type(b):
                return _first_difference(a, b, f"{path}.{name}")
    elif isinstance(given, (list, tuple)) and isinstance(stored, (list, tuple)):
        for i, (a, b) in enumerate(zip(given, stored, strict=False)):
            if a != b or type(a) is not type(b):
                return _first_difference(a, b, f"{path}[{i}]")
    elif isinstance(given, dict) and isinstance(stored, dict):
        for k in given:
            if k in stored and (given[k] != stored[k] or type(given[k]) is not type(stored[k])):
                return _first_difference(given[k], stored[k], f"{path}[{k!r}]")
    return path, given, stored


def _fingerprint(fn: Upcaster) -> str:
    """What an upcaster does, as far as its code tells: its name, its bytecode and
    constants (nested functions too), and the values its defaults and closure hold. A
    callable that is not a function (a partial, an object) gets one of its own per
    process: a fold cache is then never shared, which costs time, never a wrong state."""
    code = getattr(fn, "__code__", None)
    if not isinstance(code, types.CodeType):
        return f"{type(fn).__qualname__}@{id(fn):x}"
    digest = hashlib.sha256(f"{fn.__module__}.{fn.__qualname__}".encode())

    def add(c: types.CodeType) -> None:
        digest.update(c.co_code)
        digest.update(repr(c.co_names).encode())
        for const in c.co_consts:
            if isinstance(const, types.CodeType):
                add(const)
            elif isinstance(const, frozenset):  # (`x in {...}`): its order is per process
                digest.update(repr(sorted(map(repr, const))).encode())
            else:
                digest.update(repr(const).encode())

    add(code)
    cells = tuple(c.cell_contents for c in getattr(fn, "__closure__", None) or ())
    state = (getattr(fn, "__defaults__", None), getattr(fn, "__kwdefaults__", None), cells)
    digest.update(repr(state).encode("utf-8", "backslashreplace"))
    return digest.hexdigest()[:16]


def _with_types(
    types: dict[str, type[Event]], event_types: Iterable[type[Event]]
) -> dict[str, type[Event]]:
    """A copy of `types` (tag -> class) with `event_types` added, each checked."""
    out = dict(types)
    for cls in event_types:
        if not (isinstance(cls, type) and issubclass(cls, Event)):
            raise InvalidRecordError(f"{cls!r} is not an Event subclass")
        tag = event_tag(cls)
        if tag in out and out[tag] is not cls:
            raise InvalidRecordError(f"two event types share the tag {tag!r}")
        out[tag] = cls
    return out


class EventCodec:
    """Encodes and decodes log lines for one set of event types.

    Decoders are built per set of needed types: types a projection does not need are
    decoded as bare envelopes, so their payloads are parsed but never materialized.
    """

    def __init__(self, event_types: Iterable[type[Event]] = ()) -> None:
        self.types: dict[str, type[Event]] = _with_types({}, (*BUILTIN_EVENT_TYPES, *event_types))
        self._upcasters: dict[tuple[str, int], Upcaster] = {}
        self._encoder = msgspec.json.Encoder()
        self._decoders: dict[frozenset[str] | None, _PlainDecoder] = {}
        self._stubs: dict[str, type[Event]] = {}
        self.head_decoder = HEAD_DECODER
        self._dict_decoder = msgspec.json.Decoder(dict[str, Any])
        self.opener: Opener | None = None
        """Gives the data keys of encrypted lines (set by a store opened with keys)."""

    # -- encrypted lines -----------------------------------------------------------------

    def key_of(self, dk: str) -> DataKey:
        """The data key of id `dk`, from `opener`; KeyMissingError without one."""
        if self.opener is None:
            from eventstore.errors import KeyMissingError

            raise KeyMissingError(dk, None, "the line is encrypted and the store has no keys")
        return self.opener(dk)

    def can_decrypt(self, line: bytes) -> bool:
        """Whether the data key of an encrypted `line` is to be had (no error either way)."""
        dk = encrypted_key_id(line)
        if dk is None or self.opener is None:
            return dk is None
        from eventstore.errors import EventStoreError

        try:
            self.opener(dk)
        except EventStoreError:
            return False
        return True

    def envelope_of(self, line: bytes) -> Event:
        """An encrypted line read without its payload: its type's envelope-only stand-in."""
        tag = line_tag(line).decode("utf-8", "replace")
        if tag not in self.types:
            return self._decode_line(line, 0, "?")
        return msgspec.json.decode(line, type=self._stub(tag))

    def learn(self, event_types: Iterable[type[Event]]) -> list[str]:
        """Decode `event_types` too, from now on; the tags that are new (none: nothing
        changes). A type whose tag is another type's is an InvalidRecordError, and then
        nothing is learned. The decoders are rebuilt (the dicts are replaced, never
        changed in place, so a reader on another thread sees the old set or the new)."""
        types = _with_types(self.types, event_types)
        new = [tag for tag in types if tag not in self.types]
        if new:
            self._decoders = {}
            self._stubs = {}
            self.types = types
        return new

    # -- schema evolution -------------------------------------------------------------

    def register_upcaster(self, cls: type[Event], from_version: int, fn: Upcaster) -> None:
        """Register `fn` to turn a payload of `cls` at `from_version` into `from_version + 1`."""
        if (
            not (isinstance(cls, type) and issubclass(cls, Event))
            or event_tag(cls) not in self.types
        ):
            raise InvalidRecordError(f"{cls!r} is not an event type this codec knows")
        if isinstance(from_version, bool) or not isinstance(from_version, int) or not callable(fn):
            raise InvalidRecordError(
                f"an upcaster of {cls.__name__} needs an int version and a function,"
                f" not {from_version!r} and {fn!r}"
            )
        if from_version >= cls.VERSION:
            raise InvalidRecordError(
                f"{cls.__name__} is at version {cls.VERSION}; an upcaster from"
                f" version {from_version} would never run"
            )
        self._upcasters[(event_tag(cls), from_version)] = fn

    def reading(self, tag: str) -> str:
        """How this codec reads events of `tag`: the tag itself for a type at version 1,
        else also its version and a fingerprint of each upcaster it runs. Two codecs
        with the same reading decode a line of that type to the same event (a fold
        cache is keyed by it: eventstore.core.fold_cache.known_types)."""
        cls = self.types[tag]
        if cls.VERSION == 1:
            return tag
        steps = [
            f"{v}:{_fingerprint(fn)}" if fn is not None else f"{v}:-"
            for v in range(1, cls.VERSION)
            for fn in (self._upcasters.get((tag, v)),)
        ]
        return f"{tag} v{cls.VERSION} " + " ".join(steps)

    def upcast(self, data: dict[str, Any], offset: int, path: object) -> Event:
        """Bring a decoded line (a dict) to its type's current version and convert it."""
        tag = data.get("type")
        cls = self.types.get(tag) if isinstance(tag, str) else None
        if cls is None:
            raise KeyError(tag)
        version = data.get("v", 1)
        seq = data.get("seq")
        if not isinstance(version, int):
            raise CorruptLogError(path, offset, seq, "version is not an integer")
        # the envelope is the line's, checked by the hash chain: an upcaster turns the
        # payload only (one that builds a new dict of payload fields drops the envelope,
        # one that sets `seq` or `key` would forge it), so it is put back after
        envelope = {k: data[k] for k in _ENVELOPE_FIELDS if k in data}
        while version < cls.VERSION:
            fn = self._upcasters.get((event_tag(cls), version))
            if fn is None:
                raise CorruptLogError(
                    path,
                    offset,
                    seq,
                    f"{tag} version {version} needs an upcaster to version {cls.VERSION}",
                )
            try:
                out: object = fn(dict(data))
            except Exception as exc:  # a user's function: its error names no line
                raise CorruptLogError(
                    path,
                    offset,
                    seq,
                    f"the upcaster of {tag} from version {version} raised {exc!r}",
                ) from exc
            if not isinstance(out, dict):
                raise CorruptLogError(
                    path,
                    offset,
                    seq,
                    f"the upcaster of {tag} from version {version} returned a"
                    f" {type(out).__name__}, not a dict",
                )
            data = out
            version += 1
        if version > cls.VERSION:
            raise CorruptLogError(
                path,
                offset,
                seq,
                f"{tag} version {version} is newer than this reader's {cls.VERSION}",
            )
        for k in _ENVELOPE_FIELDS:
            data.pop(k, None)
        data.update(envelope)
        data["v"] = cls.VERSION
        try:
            return msgspec.convert(data, cls)
        except msgspec.ValidationError as exc:
            raise CorruptLogError(path, offset, seq, f"bad {tag}: {exc}") from None

    # -- decoding ---------------------------------------------------------------------

    def decoder(
        self, needed: frozenset[str] | None = None, *, lenient: bool = False
    ) -> LineDecoder:
        """A `decode_lines` decoder for the tags in `needed` (None: every type).

        Snapshots and tombstones (which reset every projection) are always decoded in
        full; other types outside `needed` become stubs. Encrypted lines of the needed
        types are decrypted first (a missing key raises); `lenient` (verify): an encrypted
        line whose key is not to be had becomes its type's envelope-only stand-in instead.
        """
        key = None if needed is None else frozenset(needed | _ALWAYS_DECODED)
        return _DecryptingDecoder(
            self, self._plain_decoder(key), None if key is None else tags_in(key), lenient,
            needed is not None and needed <= KEYLESS_TYPES,
        )  # fmt: skip

    def _plain_decoder(self, key: frozenset[str] | None) -> _PlainDecoder:
        dec = self._decoders.get(key)
        if dec is None:
            known = self.types
            if key is None:
                dec = _union_decoder(list(known.values()))
            else:
                dec = _Widening(self, key)
            self._decoders[key] = dec
        return dec

    def _stub(self, tag: str) -> type[Event]:
        stub = self._stubs.get(tag)
        if stub is None:
            # same VERSION as the real type, so only a truly old line takes the slow path
            made: type[Event] = msgspec.defstruct(  # type: ignore[assignment]
                f"Skipped_{tag}",
                [],
                bases=(Event,),
                tag=tag,
                kw_only=True,
                omit_defaults=True,
                namespace={"VERSION": self.types[tag].VERSION, "SKIPPED": True},
            )
            stub = self._stubs[tag] = made
        return stub

    def decode_line(self, line: bytes, offset: int, path: object) -> Event:
        """Decode one line (no newline) slowly but exactly; for error paths and `verify`.
        A line nested too deep for the decoder is a CorruptLogError like any other."""
        try:
            return self._decode_line(line, offset, path)
        except RecursionError:
            raise CorruptLogError(path, offset, None, too_deep_reason(line)) from None

    def _decode_line(self, line: bytes, offset: int, path: object) -> Event:
        try:
            head = self.head_decoder.decode(line)
        except msgspec.ValidationError as exc:
            raise CorruptLogError(
                path, offset, None, f"not an event (an object with 'type' and 'seq'): {exc}"
            ) from None
        except msgspec.DecodeError as exc:
            raise CorruptLogError(path, offset, None, f"not JSON: {exc}") from None
        cls = self.types.get(head.type)
        if cls is not None and ENC_MARK in line:  # (an unknown type is kept as encrypted)
            line = decrypt_line(line, self.key_of, path, offset)
        if cls is None:
            try:  # kept verbatim (e.g. in a snapshot), so the whole line must be valid JSON
                self._dict_decoder.decode(line)
            except msgspec.DecodeError as exc:
                raise CorruptLogError(path, offset, head.seq, f"bad {head.type}: {exc}") from None
            return UnknownEvent(
                seq=head.seq,
                ts=head.ts,
                more=head.more,
                key=head.key,
                h=head.h,
                type_name=head.type,
                raw=line,
            )
        if cls is Snapshot and head.v == cls.VERSION:
            try:
                snap = msgspec.json.decode(line, type=Snapshot)
            except msgspec.DecodeError as exc:
                raise CorruptLogError(path, offset, head.seq, f"bad {head.type}: {exc}") from None
            if states_encrypted(snap.states):
                snap.states = decrypt_states(snap.states, snap.seq, snap.base_h, self.key_of)
            return snap
        if head.v == cls.VERSION:
            try:
                return msgspec.json.decode(line, type=cls)
            except msgspec.DecodeError as exc:  # also invalid UTF-8 the envelope skipped over
                raise CorruptLogError(path, offset, head.seq, f"bad {head.type}: {exc}") from None
        # an older version: only now is the line needed as a dict, for the upcasters
        try:
            data = self._dict_decoder.decode(line)
        except msgspec.DecodeError as exc:
            raise CorruptLogError(path, offset, head.seq, f"bad {head.type}: {exc}") from None
        return self.upcast(data, offset, path)

    # -- encoding ---------------------------------------------------------------------

    def check(self, event: object) -> Event:
        """A validated private deep copy of `event`; InvalidRecordError for what is not a
        registered, well-formed event. Runs before anything is written."""
        if isinstance(event, UnknownEvent) or not isinstance(event, Event):
            raise InvalidRecordError(f"expected an Event, got {type(event).__name__}")
        tag = event_tag(type(event))
        if self.types.get(tag) is not type(event):
            raise InvalidRecordError(
                f"event type {type(event).__name__} ({tag!r}) is not registered with this store"
            )
        return validated_copy(event, type(event), f"{tag} event")

    def encode_batch(
        self,
        events: Sequence[Event],
        first_seq: int,
        link: str,
        ts: datetime,
        key: str | None,
        *,
        check: bool = False,
        max_depth: int | None = MAX_DEPTH,
        cipher: DataKey | None = None,
    ) -> tuple[bytes, list[Event], str]:
        """Stamp `events` as one batch and encode it; returns (bytes, stamped, new link).

        `check`: the events are the caller's, unvalidated; each stamped event returned is
        then decoded from its own line (a private copy, as it reads back; plain text
        messages are copied instead, see `_plain_copies`), and `NotAsStoredError` is
        raised, before anything is returned, if one would not read back equal or cannot
        be encoded. `validated_copy` of each record finds the same, and names the field.

        `max_depth`: a line nesting deeper is refused with `NestingTooDeepError` before
        anything is returned (`eventstore.format.depth`); None for a snapshot, which
        wraps in a few more levels states folded from lines that kept to the limit.

        `cipher`: the session's data key: each line's payload is encrypted with it
        (`eventstore.format.crypt`) and its hash computed over the encrypted line.
        """
        # the append hot path: each event encoded once, its hash over the encoded body
        # (h omitted, see `line_hash`), the line's bytes joined once at the end
        parts: list[bytes] = []
        stamped: list[Event] = []
        encode = self._encoder.encode
        last = len(events) - 1
        for i, ev in enumerate(events):
            ev = _replace(
                ev,
                seq=first_seq + i,
                ts=ts,
                more=last - i,
                key=key if i == 0 else None,
                v=type(ev).VERSION,
                h="",
            )
            if check:
                # one round trip of the whole event does what validated_copy does per
                # record (a record would read back equal iff the event holding it does)
                plain = _plain_copies(ev) if type(ev) is MessagesAppended else None
                if plain is not None:
                    # the private copies themselves are encoded (nothing a caller can
                    # change meanwhile): what is folded is what the line holds
                    ev.messages = plain  # type: ignore[attr-defined]  # (_replace's own)
                try:
                    body = self._encoded(ev, encode, max_depth if plain is None else None)
                    copy = ev if plain is not None else self.read_back(body, type(ev))
                except NestingTooDeepError:
                    raise
                except (msgspec.MsgspecError, TypeError, UnicodeEncodeError) as exc:
                    raise NotAsStoredError(str(exc)) from exc
                if copy is not ev:
                    if copy != ev:
                        raise NotAsStoredError(f"{type(ev).__name__} would not read back equal")
                    ev = copy
            else:
                body = self._encoded(ev, encode, max_depth)
            if cipher is not None:
                body = encrypt_body(
                    body, event_tag(type(ev)), ev.seq, ts, ev.more, ev.key, ev.v, cipher
                )
            digest = _blake2b(link.encode(), digest_size=8)
            digest.update(body)
            h = digest.hexdigest()
            parts.append(body[:-1])
            parts.append(b',"h":"' + h.encode() + b'"}\n')
            ev.h = h
            link = link_of(ev)
            stamped.append(ev)
        return b"".join(parts), stamped, link

    @staticmethod
    def _encoded(ev: Event, encode: Callable[[Any], bytes], max_depth: int | None) -> bytes:
        """`encode(ev)`: NestingTooDeepError if it nests deeper than `max_depth`,
        InvalidRecordError if it holds a newline or a lone surrogate (the errors' words
        made only for them: this runs for every event appended)."""
        try:
            body = encode(ev)
        except RecursionError:
            raise _too_deep(f"a {event_tag(type(ev))} event") from None
        except UnicodeEncodeError as exc:  # e.g. in a dict key, which no check before reads
            raise _lone_surrogate(f"a {event_tag(type(ev))} event", exc) from None
        if (max_depth is not None and over(body, max_depth)) or b"\n" in body:
            what = f"a {event_tag(type(ev))} event"
            if max_depth is not None:
                check_depth(body, what, max_depth)
            _check_one_line(body, what)
        return body

    def read_back(self, body: bytes, cls: type[Event]) -> Event:
        """`body` (an event's JSON) decoded as `cls`: the round trip `encode_batch(check=True)`
        compares each event with. A seam: a test replaces it to change an event between
        its encoding and its check, as another thread could."""
        return msgspec.json.decode(body, type=cls)

    def encode_snapshot(
        self, snap: Snapshot, seq: int, link: str, ts: datetime, cipher: DataKey | None = None
    ) -> tuple[bytes, Snapshot]:
        """Encode a snapshot line whose `length` and `layout` describe the line itself.
        `cipher`: the session's data key: each state's entry is encrypted with it (the
        snapshot returned keeps the states as given)."""
        given = snap.states
        if cipher is not None:
            snap = msgspec.structs.replace(
                snap, states=encrypt_states(given, seq, snap.base_h, cipher)
            )
        layout: dict[str, tuple[int, int]] = {}
        length = 0
        for _ in range(8):  # offsets shift only when a number gains a digit: this converges
            trial = msgspec.structs.replace(snap, layout=layout, length=length)
            data, stamped, _ = self.encode_batch([trial], seq, link, ts, None, max_depth=None)
            found = locate_states(data, snap.states)
            if found == layout and len(data) - 1 == length:
                _check_snapshot_depth(data, found)
                out: Snapshot = stamped[0]  # type: ignore[assignment]
                out.states = given
                return data, out
            layout, length = found, len(data) - 1
        raise AssertionError("snapshot layout did not converge")

    def encode_unhashed(self, event: Event) -> bytes:
        """The JSON of one event as given (no stamping); for export and snapshots."""
        return self._encoder.encode(event)
