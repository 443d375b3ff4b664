"""Signed heads (`eventstore.ops.seal`): a store opened with a signing key seals its
sessions, `verify` with the public key or a witness checks the seals against the
history, and a keyed store's caches carry a MAC. The attacks: a whole-history rewrite with
a freshly computed chain (seals kept, dropped or re-pointed), a forged signature, a
truncation to before the last seal, a rewrite of the log *and* its seals, a forged fold
cache, wrong and missing keys."""

from __future__ import annotations

import asyncio
import hashlib
import os
import zlib
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eventstore import (
    CorruptLogError,
    Event,
    InvalidArgumentError,
    InvalidSessionIdError,
    Message,
    Role,
    Sealed,
    SealPolicy,
    SealWitnessed,
    SessionStore,
    SigningKeyError,
    StorageError,
    Tuning,
)
from eventstore.aio import AsyncSessionStore
from eventstore.format.codec import EventCodec
from eventstore.session_ids import validate_session_id
from tests.conftest import cache_path, cli_in_process, log_path, make_entry, run_threads
from tests.engines import EngineCase

KEY = Ed25519PrivateKey.generate()
SID = "audited"


def write_sealed(url: str, n: int, *, every: int = 3, witness: Path | str | None = None) -> None:
    """`n` progress entries, one append each, by a store sealing every `every` (and at close)."""
    policy = SealPolicy(every=every, witness=witness)
    with SessionStore(url, signing_key=KEY, seal_policy=policy) as s:
        for i in range(n):
            s.append_progress_entry(SID, make_entry(i))


def kinds(url: str, **verify: object) -> list[str]:
    with SessionStore(url) as s:
        report = s.verify(SID, **verify)  # type: ignore[arg-type]
    return [p.kind for p in report.problems if p.severity == "error"]


def rewrite_history(case: EngineCase, url: str, edit: Callable[[list[Event]], list[Event]]) -> None:
    """Rewrite the session's whole log as `edit` makes its events, every line re-encoded
    and chained afresh with the public codec: what an attacker with write access does."""
    codec = EventCodec()
    with SessionStore(url) as s:
        events = edit(list(s.read_events(SID)))
        out, link = b"", ""
        for seq, ev in enumerate(events, 1):
            data, _, link = codec.encode_batch([ev], seq, link, ev.ts, ev.key)
            out += data
        case.rewrite(s, SID, lambda _: out)


def edited(events: list[Event]) -> list[Event]:
    """The events with the first progress entry's summary changed."""
    first = events[0]
    entry = msgspec.structs.replace(first.entry, summary="never happened")  # type: ignore[attr-defined]
    return [msgspec.structs.replace(first, entry=entry), *events[1:]]


def test_a_sealing_store_seals_by_count_at_close_and_after_compaction(url: str) -> None:
    write_sealed(url, 7, every=3)
    with SessionStore(url) as s:
        types = [type(e).__name__ for e in s.read_events(SID)]
        seals = [e for e in s.read_events(SID) if isinstance(e, Sealed)]
        assert s.load_bootstrap_state(SID).recent_progress[-1].summary == make_entry(6).summary
    # after 3, 3 more (the policy), then the last one at close
    assert types.count("Sealed") == 3 and types[3] == types[7] == types[-1] == "Sealed"
    assert all(e.sealed_seq == e.seq - 1 for e in seals)
    assert kinds(url, public_key=KEY.public_key()) == []
    with SessionStore(url, signing_key=KEY) as s:
        assert s.compact(SID, force=True).compacted
        last = list(s.read_events(SID))[-1]
        assert isinstance(last, Sealed) and last.sealed_seq == last.seq - 1
        assert s.seal(SID) is None  # already sealed: nothing written
    assert kinds(url, public_key=KEY.public_key()) == []


@pytest.mark.parametrize("seals", ["kept", "dropped", "re_pointed"])
def test_a_whole_history_rewrite_with_a_recomputed_chain_fails_verify_with_the_public_key(
    case: EngineCase, url: str, seals: str
) -> None:
    write_sealed(url, 5, every=2)

    def attack(events: list[Event]) -> list[Event]:
        events = edited(events)
        if seals == "dropped":
            return [e for e in events if not isinstance(e, Sealed)]
        return events

    rewrite_history(case, url, attack)
    if seals == "re_pointed":
        # the attacker also points each seal at the new chain's hash (it cannot sign)
        with SessionStore(url) as s:
            hashes = {e.seq: e.h for e in s.read_events(SID)}

        def repoint(events: list[Event]) -> list[Event]:
            return [
                msgspec.structs.replace(e, sealed_h=hashes[e.sealed_seq])
                if isinstance(e, Sealed)
                else e
                for e in events
            ]

        rewrite_history(case, url, repoint)
    with SessionStore(url) as s:
        assert s.verify(SID).ok  # the chain alone cannot tell
        assert s.load_bootstrap_state(SID).recent_progress[0].summary == "never happened"
    expected = {"kept": "seal_mismatch", "dropped": "seal_missing", "re_pointed": "seal_signature"}
    assert expected[seals] in kinds(url, public_key=KEY.public_key())


def test_seals_missing_where_the_policy_says_one_must_be_are_reported(url: str) -> None:
    with SessionStore(url) as s:
        s.append_progress_entry(SID, make_entry(0))
    assert kinds(url, public_key=KEY) == ["seal_missing"]  # never sealed
    write_sealed(url, 1, every=2)
    assert kinds(url, public_key=KEY) == []
    with SessionStore(url) as s:  # a writer without the key: no seal follows
        for i in range(3):
            s.append_progress_entry(SID, make_entry(i))
        # one batch past the policy's 2 may be another writer's that came first: a warning
        warned = [(p.kind, p.severity) for p in s.verify(SID, public_key=KEY).problems]
        assert warned == [("seal_overdue", "warning")]
        s.append_progress_entry(SID, make_entry(3))
    assert kinds(url, public_key=KEY) == ["seal_overdue"]
    with SessionStore(url, signing_key=KEY) as s:
        assert s.seal(SID) is not None
    assert kinds(url, public_key=KEY) == ["seal_overdue"]  # 4 between two seals: still late


def test_a_seal_by_another_key_or_session_is_reported(case: EngineCase, url: str) -> None:
    write_sealed(url, 2, every=5)
    other = Ed25519PrivateKey.generate()
    assert kinds(url, public_key=other.public_key()) == ["seal_key"]
    with SessionStore(url) as s:
        before = list(s.read_events(SID))

    def elsewhere(events: list[Event]) -> list[Event]:
        return [
            msgspec.structs.replace(e, session_id="other") if isinstance(e, Sealed) else e
            for e in events
        ]

    rewrite_history(case, url, elsewhere)
    assert kinds(url, public_key=KEY) == ["seal_session"]  # a seal copied from another session
    assert len(before) == 3


def test_the_witness_catches_a_rewrite_of_the_log_and_its_seals(
    case: EngineCase, url: str, tmp_path: Path
) -> None:
    witness = tmp_path / "witness.jsonl"
    write_sealed(url, 6, every=2, witness=witness)
    assert witness.read_bytes().count(b"\n") == 3
    assert kinds(url, public_key=KEY, witness=witness) == []
    # the attacker rewrites the history and drops every seal (which it cannot re-sign):
    # with no seal left in the log and no public key, only the witness can tell
    rewrite_history(case, url, lambda ev: [e for e in edited(ev) if not isinstance(e, Sealed)])
    with SessionStore(url) as s:
        assert s.verify(SID).ok
    assert "seal_mismatch" in kinds(url, witness=witness)


def test_the_witness_catches_a_truncation_to_before_the_last_seal(
    case: EngineCase, url: str, tmp_path: Path
) -> None:
    witness = tmp_path / "witness.jsonl"
    write_sealed(url, 6, every=2, witness=witness)
    # cut the log just after its first seal: what is left is signed and checks
    with SessionStore(url) as s:
        events = list(s.read_events(SID))
    first_seal = next(e.seq for e in events if isinstance(e, Sealed))
    rewrite_history(case, url, lambda ev: ev[:first_seal])
    assert kinds(url, public_key=KEY) == []  # every seal left is good: cannot tell
    assert "seal_ahead" in kinds(url, public_key=KEY, witness=witness)


def test_a_witness_seal_the_log_no_longer_holds_is_reported(
    case: EngineCase, url: str, tmp_path: Path
) -> None:
    witness = tmp_path / "witness.jsonl"
    write_sealed(url, 4, every=2, witness=witness)  # 1 2 seal 4 5 seal
    rewrite_history(case, url, lambda ev: [e for e in ev if not isinstance(e, Sealed)])
    # lines 1 and 2 are intact, but the seal after them is gone
    assert kinds(url, witness=witness) == ["seal_dropped", "seal_ahead"]


# -- keys ----------------------------------------------------------------------------


def test_wrong_or_missing_keys_are_typed_errors_naming_the_key_id(url: str, tmp_path: Path) -> None:
    public = KEY.public_key()
    pem = tmp_path / "public.pem"
    pem.write_bytes(
        public.public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    for bad in (public, pem):
        with pytest.raises(SigningKeyError) as err:
            SessionStore(url, signing_key=bad)
        assert err.value.key_id is not None and err.value.key_id in str(err.value)
        assert "BEGIN" not in str(err.value)
    with pytest.raises(SigningKeyError, match="cannot read"):
        SessionStore(url, signing_key=tmp_path / "missing.pem")
    fresh = tmp_path / "never-created"
    with pytest.raises(SigningKeyError):
        SessionStore(fresh, signing_key=public)  # type: ignore[arg-type]
    assert not fresh.exists()  # refused before the store opened: nothing written
    with pytest.raises(SigningKeyError):
        SessionStore(url, seal_policy=SealPolicy())
    with SessionStore(url) as s:
        s.append_progress_entry(SID, make_entry(0))
        with pytest.raises(SigningKeyError, match="no signing key"):
            s.seal(SID)
        assert s.last_seq(SID) == 1  # nothing written


def test_a_key_given_as_a_pem_file_seals_and_verifies(url: str, tmp_path: Path) -> None:
    private = tmp_path / "seal.pem"
    private.write_bytes(
        KEY.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    with SessionStore(url, signing_key=private) as s:
        s.append_progress_entry(SID, make_entry(0))
    assert kinds(url, public_key=private) == []


# -- keyed caches --------------------------------------------------------------------


def _forge(path: Path, width: int) -> None:
    """Change the cached transcript's text and close the cache with a fresh CRC-32, as
    anyone who can write the file can (the engine's first line kept)."""
    engine_line, _, cache = path.read_bytes().partition(b"\n")
    body = cache[: -(width + 1)].replace(b"hello", b"HELLO")
    path.write_bytes(engine_line + b"\n" + body + b"%08x\n" % zlib.crc32(body))


@pytest.mark.parametrize("keyed", [False, True], ids=["unkeyed", "keyed"])
def test_a_forged_fold_cache_is_refused_by_a_keyed_store(tmp_path: Path, keyed: bool) -> None:
    root = tmp_path / "store"
    key = {"signing_key": KEY} if keyed else {}
    tuning = Tuning(cache_on_close=0)
    with SessionStore(root, tuning=tuning, **key) as s:  # type: ignore[arg-type]
        s.append_transcript_messages(SID, [Message(role=Role.USER, content="hello")])
        s.load_transcript_messages(SID)
    cache = cache_path(root, SID, "transcript")
    assert cache.exists()
    _forge(cache, 64 if keyed else 8)
    with SessionStore(root, tuning=tuning, **key) as s:  # type: ignore[arg-type]
        got = [m.content for m in s.load_transcript_messages(SID)]
    # an unkeyed store cannot tell a forged cache from its own; a keyed one reads the log
    assert got == (["hello"] if keyed else ["HELLO"])
    assert b"hello" in log_path(root, SID).read_bytes()


def test_a_keyed_store_ignores_caches_written_without_its_key(tmp_path: Path) -> None:
    root = tmp_path / "store"
    tuning = Tuning(cache_on_close=0)
    with SessionStore(root, tuning=tuning) as s:
        s.append_transcript_messages(SID, [Message(role=Role.USER, content="hello")])
        s.load_transcript_messages(SID)
    with SessionStore(root, tuning=tuning, cache_key=b"k" * 32) as s:
        assert [m.content for m in s.load_transcript_messages(SID)] == ["hello"]
        assert s.cache_info(SID).folds["transcript"][1] is None  # not from the cache


# -- the command ---------------------------------------------------------------------


def test_the_seal_and_verify_commands(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "store"
    private, public = tmp_path / "seal.pem", tmp_path / "seal.pub"
    private.write_bytes(
        KEY.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    public.write_bytes(
        KEY.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    with SessionStore(root) as s:
        s.append_progress_entry(SID, make_entry(0))
    code, _, _ = cli_in_process(capsys, "verify", str(root), SID, "--public-key", str(public))
    assert code == 1
    witness = tmp_path / "w.jsonl"
    code, out, _ = cli_in_process(
        capsys, "seal", str(root), "--all", "--key", str(private), "--witness", str(witness)
    )
    assert code == 0 and SID in out
    code, _, _ = cli_in_process(
        capsys, "verify", str(root), SID, "--public-key", str(public), "--witness", str(witness)
    )
    assert code == 0
    code, _, err = cli_in_process(capsys, "seal", str(root), SID, "--key", str(public))
    assert code != 0 and "ed25519:" in err


# -- more attacks: races, odd ids and batch sizes, compaction ---------------------------


def test_threads_racing_a_sealing_store_leave_every_seal_good(url: str) -> None:
    policy = SealPolicy(every=2)
    with SessionStore(url, signing_key=KEY, seal_policy=policy) as s:

        def writer(t: int) -> Callable[[], None]:
            def run() -> None:
                for i in range(10):
                    s.append_progress_entry(SID, make_entry(i, run_id=f"t{t}"))
                    if i % 4 == 0:
                        s.seal(SID)

            return run

        assert run_threads([writer(t) for t in range(4)]) == []
    with SessionStore(url) as s:
        report = s.verify(SID, public_key=KEY)
        assert len(s.load_bootstrap_state(SID).recent_progress) == 40
    # the write and the seal it makes due hold the session: no other thread comes between
    assert report.problems == []


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sid=st.text(min_size=1, max_size=20).filter(lambda s: "\x00" not in s),
    batches=st.lists(st.integers(1, 6), min_size=1, max_size=8),
    every=st.integers(1, 5),
)
def test_any_session_id_and_batch_sizes_seal_and_verify(
    tmp_path_factory: pytest.TempPathFactory, sid: str, batches: list[int], every: int
) -> None:
    root = tmp_path_factory.mktemp("store")
    try:
        validate_session_id(sid)
    except InvalidSessionIdError:
        return
    with SessionStore(root, signing_key=KEY, seal_policy=SealPolicy(every=every)) as s:
        for n in batches:
            s.append_transcript_messages(sid, [Message(role=Role.USER, content="x")] * n)
    with SessionStore(root) as s:
        report = s.verify(sid, public_key=KEY)
        seals = [e for e in s.read_events(sid) if isinstance(e, Sealed)]
    assert report.ok, report.problems
    assert seals and all(e.session_id == sid for e in seals)


def test_seals_survive_a_keyless_compaction_with_an_archive_not_one_without(url: str) -> None:
    write_sealed(url, 5, every=2)
    with SessionStore(url) as s:  # a compaction by a store without the key
        assert s.compact(SID, force=True).compacted
    assert kinds(url, public_key=KEY) == []  # the archive holds every sealed line
    with SessionStore(url, signing_key=KEY) as s:
        s.append_progress_entry("bare", make_entry(0))
        s.append_progress_entry("bare", make_entry(1))
    with SessionStore(url) as s:
        assert s.compact("bare", force=True, archive=False).compacted
        report = s.verify("bare", public_key=KEY)
    # the seal went with the lines it stood after, and no archive keeps it
    assert [p.kind for p in report.problems if p.severity == "error"] == ["seal_missing"]


def test_a_sealing_store_compacting_again_leaves_its_seals_good(url: str, tmp_path: Path) -> None:
    """A sealing store seals each snapshot it installs; its next compaction replaces that
    snapshot, and the archive keeps the lines the snapshot stood for, not the snapshot.
    `verify` with the public key and the witness then reported `seal_mismatch` ("the
    history was rewritten after the seal"), once for the log's seal and once for the
    witness's, of a history nobody touched. Such a seal is `seal_unchecked` (a warning)."""
    witness = tmp_path / "witness.jsonl"
    policy = SealPolicy(every=3, witness=witness)
    with SessionStore(url, signing_key=KEY, seal_policy=policy) as s:
        for _ in range(3):
            for i in range(4):
                s.append_progress_entry(SID, make_entry(i))
            assert s.compact(SID, force=True).compacted
    with SessionStore(url) as s:  # and once by a store without the key
        s.append_progress_entry(SID, make_entry(4))
        assert s.compact(SID, force=True).compacted
    with SessionStore(url) as s:
        report = s.verify(SID, public_key=KEY, witness=witness)
    assert report.ok, report.problems
    unchecked = [p for p in report.problems if p.kind == "seal_unchecked"]
    assert unchecked == report.problems and all("replaced" in p.message for p in unchecked)


def test_a_session_a_sealing_store_deleted_is_no_missing_seal(url: str) -> None:
    """A session deleted by a sealing store (its log now the tombstone alone, which no
    writer can seal: every write after it is refused) failed `verify --public-key` with
    `seal_missing`, an error, as if the store had broken its policy. A tombstone needs no
    seal; a session written to again after a restore does."""
    write_sealed(url, 3, every=2)
    with SessionStore(url, signing_key=KEY) as s:
        assert s.delete_session(SID)
    assert kinds(url, public_key=KEY) == []
    with SessionStore(url) as s:  # restored and written to by a store without the key
        assert s.restore(SID)
        s.append_progress_entry(SID, make_entry(9))
    assert "seal_missing" in kinds(url, public_key=KEY)


def test_the_async_store_seals_and_verifies(tmp_path: Path) -> None:
    async def main() -> None:
        async with AsyncSessionStore(SessionStore(tmp_path, signing_key=KEY)) as st:
            await st.append_progress_entry(SID, make_entry(0))
            assert (await st.seal(SID)) is not None
            assert (await st.verify(SID, public_key=KEY.public_key())).ok

    asyncio.run(main())


def test_a_seal_policy_by_time_seals_after_a_write_that_comes_late_enough(tmp_path: Path) -> None:
    # (no clock is read by the test: a policy of a nanosecond is due at every write after
    # the first, which starts the clock, and one of an hour at none within this test)
    for seconds, seals in ((1e-9, 2), (3600.0, 0)):
        url = str(tmp_path / f"s{seals}")
        policy = SealPolicy(every=None, seconds=seconds, on_close=False)
        with SessionStore(url, signing_key=KEY, seal_policy=policy) as s:
            for i in range(3):
                s.append_progress_entry(SID, make_entry(i))
            assert sum(isinstance(e, Sealed) for e in s.read_events(SID)) == seals


def test_seals_travel_with_migrate_and_verify_on_the_other_engine(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src, dst = str(tmp_path / "src"), f"memory://seal-{tmp_path.name}"
    write_sealed(src, 5, every=2)
    code, _, err = cli_in_process(capsys, "migrate", src, dst, "--all")
    assert code == 0, err
    with SessionStore(dst) as s:
        assert sum(isinstance(e, Sealed) for e in s.read_events(SID)) == 3
        assert s.verify(SID, public_key=KEY).problems == []


def test_a_keyed_store_refuses_a_checked_prefix_forged_over_an_edited_log(
    tmp_path: Path,
) -> None:
    """The checked prefix spares a load the per-line hashes of bytes it vouches for by one
    SHA-256; anyone who can write it can vouch for an edited log. A keyed store's carries
    its MAC: one forged without the key is ignored, and the edit is found."""
    root = tmp_path / "store"
    tuning = Tuning(cache_on_close=0)
    for keyed in (False, True):
        key = {"signing_key": KEY} if keyed else {}
        sid = f"{SID}-{keyed}"
        with SessionStore(root, tuning=tuning, caches=True, **key) as s:  # type: ignore[arg-type]
            for i in range(5):
                s.append_progress_entry(sid, make_entry(i))
        for name in ("bootstrap", "transcript"):
            cache_path(root, sid, name).unlink(missing_ok=True)
        with SessionStore(root, tuning=tuning, **key) as s:  # type: ignore[arg-type]
            s.load_bootstrap_state(sid)  # a checked load from the start: saves the prefix
        prefix = cache_path(root, sid, "@checked-prefix")
        assert prefix.exists()
        for name in ("bootstrap", "transcript"):
            cache_path(root, sid, name).unlink(missing_ok=True)
        log = log_path(root, sid)
        data = log.read_bytes()
        forged = data.replace(
            make_entry(1).summary.encode(), make_entry(1).summary.upper().encode()
        )
        assert forged != data and len(forged) == len(data)
        log.write_bytes(forged)  # (the same file: the prefix's place in it still holds)
        engine_line, _, stored = prefix.read_bytes().partition(b"\n")
        doc = msgspec.json.decode(stored.split(b"\n")[0])
        doc["sha256"] = hashlib.sha256(forged[: doc["size"]]).hexdigest()
        prefix.write_bytes(engine_line + b"\n" + msgspec.json.encode(doc) + b"\n")
        with SessionStore(root, tuning=tuning, **key) as s:  # type: ignore[arg-type]
            if keyed:
                with pytest.raises(CorruptLogError):
                    s.load_bootstrap_state(sid)
            else:  # an unkeyed store takes the forged prefix's word for the edited line
                got = s.load_bootstrap_state(sid).recent_progress[1].summary
                assert got == make_entry(1).summary.upper()


def test_hostile_seals_and_witness_lines_are_findings_not_exceptions(
    case: EngineCase, url: str, tmp_path: Path
) -> None:
    witness = tmp_path / "witness.jsonl"
    write_sealed(url, 2, every=5, witness=witness)
    with witness.open("ab") as f:
        f.write(b"not json\n" + b'{"session_id":"audited","seq":"x"}\n' + b"\n")
    rewrite_history(
        case,
        url,
        lambda ev: [
            msgspec.structs.replace(e, sig="zz") if isinstance(e, Sealed) else e for e in ev
        ],
    )
    # (the log's seal is not the one the witness holds: replaced)
    assert kinds(url, public_key=KEY, witness=witness) == [
        "seal_signature",
        "seal_dropped",
        "witness",
        "witness",
    ]
    assert kinds(url, witness=tmp_path / "absent.jsonl") == ["witness"]


@pytest.mark.parametrize("witness", [5, b"seals.jsonl", ""], ids=repr)
def test_a_witness_that_is_no_path_nor_url_is_a_typed_error(
    tmp_path: Path, witness: object
) -> None:
    """`SealPolicy(witness=5)` (or bytes) was taken, and its store's first seal failed with
    Python's own TypeError after the seal was in the log; `verify(witness=5)` raised it
    too. Both refuse it with `InvalidArgumentError`, an empty path too."""
    with pytest.raises(InvalidArgumentError, match="witness"):
        SealPolicy(witness=witness)  # type: ignore[arg-type]
    root = tmp_path / "store"
    write_sealed(str(root), 2)
    with SessionStore(root) as s, pytest.raises(InvalidArgumentError, match="witness"):
        s.verify(SID, public_key=KEY, witness=witness)  # type: ignore[arg-type]


def test_a_witness_store_that_is_not_there_is_a_finding_and_is_never_created(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`verify --witness file:///missing` (a mistyped witness store) opened it as a writer
    does: it created an empty store there, found no seal in it and passed. A witness
    store that is not there is a finding, as an absent witness file is, and verifying
    creates nothing."""
    root = tmp_path / "store"
    write_sealed(str(root), 2, every=5)
    missing = tmp_path / "no-witness" / "store"
    witness = f"file://{missing}"
    assert kinds(str(root), public_key=KEY, witness=witness) == ["witness"]
    rc, out, _ = cli_in_process(capsys, "verify", str(root), SID, "--witness", witness, "--full")
    assert rc == 1 and "cannot read the witness" in out
    assert not missing.parent.exists()


def test_a_witness_store_catches_a_rewrite_of_the_log_and_its_seals(
    case: EngineCase, url: str, tmp_path: Path
) -> None:
    witness = f"memory://witness-{tmp_path.name}"
    write_sealed(url, 6, every=2, witness=witness)
    with SessionStore(witness) as w:  # the witness store's own log checks as any other
        held = [e for e in w.read_events(SID) if isinstance(e, SealWitnessed)]
        assert len(held) == 3 and w.verify(SID).ok
    assert kinds(url, public_key=KEY, witness=witness) == []
    rewrite_history(case, url, lambda ev: [e for e in edited(ev) if not isinstance(e, Sealed)])
    assert "seal_mismatch" in kinds(url, witness=witness)
    assert kinds(url, witness=f"memory://nothing-{tmp_path.name}") == []  # holds no seal


@pytest.mark.timeout(60)  # (a FIFO opened for writing with no reader would block)
@pytest.mark.parametrize("kind", ["missing-directory", "fifo"])
def test_a_witness_that_cannot_be_written_is_a_typed_error_and_the_seal_stays(
    tmp_path: Path, kind: str
) -> None:
    """A witness file that cannot be written fails the write to it (StorageError naming
    the witness), and the seal stays in the log. Attack: `SealPolicy(witness=PATH)`
    opened the witness file for writing as it is: a FIFO there (no reader) hung the
    seal, and so the store's close, forever; one that is not a regular file is refused."""
    root = tmp_path / "store"
    if kind == "fifo":
        witness = tmp_path / "w.fifo"
        os.mkfifo(witness)
    else:
        witness = tmp_path / "no-such-dir" / "w.jsonl"
    policy = SealPolicy(every=None, on_close=False, witness=witness)
    with SessionStore(root, signing_key=KEY, seal_policy=policy) as s:
        s.append_progress_entry(SID, make_entry(0))
        with pytest.raises(StorageError, match="witness"):
            s.seal(SID)
        assert isinstance(list(s.read_events(SID))[-1], Sealed)
    assert kinds(str(root), public_key=KEY) == []


@pytest.mark.timeout(60)  # (opened for reading, a FIFO with no writer blocks)
def test_a_fifo_or_device_given_as_the_witness_to_verify_is_a_finding_never_a_hang(
    tmp_path: Path,
) -> None:
    """Attack: `verify(witness=PATH)` (`eventstore verify --witness PATH`) read the
    witness file with a plain read: a FIFO there hung verify forever, /dev/zero read
    until memory ran out. Now a witness that is not a regular file is a `witness`
    finding, as one that cannot be read is."""
    root, fifo = tmp_path / "store", tmp_path / "w.fifo"
    write_sealed(str(root), 2, every=5)
    os.mkfifo(fifo)
    for witness in (fifo, Path("/dev/zero")):
        assert kinds(str(root), public_key=KEY, witness=witness) == ["witness"]


@pytest.mark.parametrize("purge", [False, True], ids=["restore", "purge"])
def test_a_session_deleted_and_written_again_is_sealed_by_the_same_store(
    url: str, purge: bool
) -> None:
    """Attack: a sealing store that deleted a session (and restored it, or purged it)
    and wrote to the id again never sealed it: it still counted from the old log's
    last seal (seq 9), the new log's seqs start at 1, so no count reached `every` and
    close found nothing unsealed; verify --public-key reported `seal_missing`. Now a
    write at or before the seal known starts the count again: sealed by count and close."""
    with SessionStore(url, signing_key=KEY, seal_policy=SealPolicy(every=2)) as s:
        for i in range(6):
            s.append_progress_entry(SID, make_entry(i))
        assert s.delete_session(SID, purge=purge)
        if not purge:
            assert s.restore(SID)
        for i in range(5):
            s.append_progress_entry(SID, make_entry(i))
    assert kinds(url, public_key=KEY) == []
    with SessionStore(url) as s:
        assert sum(isinstance(e, Sealed) for e in s.read_events(SID)) == 3
