"""The persistent fold cache (issue 14, item 2): a cold load starts from the cached
state and folds only the tail; a cache that does not check is ignored and rebuilt.

Attacks on the cache file: flipped bytes anywhere, truncation at any length, a cache
swapped in from another session, a stale one after compaction, repair or removal, a
symlink or a FIFO planted in its place, one from a newer projection version or of
another projection. In each case the load must equal the truth (the fold of the log
with no cache at all), and the next close must leave a cache that checks.
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path
from typing import Any

import msgspec
import pytest
from conftest import LoadSpy, log_path, make_checkpoint, make_entry, make_features, make_manifest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tuning import tune

from eventstore import (
    BootstrapState,
    CorruptLogError,
    Message,
    Role,
    SessionStore,
)
from eventstore.core import fold_cache
from eventstore.engines.base import CachingEngine
from eventstore.engines.file.caches import cache_file_name
from eventstore.format.events import Event
from projections import StructProjection


def _cache(root: Path, sid: str, name: str = "bootstrap") -> Path:
    return log_path(root, sid).parent / cache_file_name(name)


def _fill(store: SessionStore, sid: str, turns: int = 120) -> None:
    store.initialize_session_if_missing(sid, make_manifest(sid), make_features(20))
    for i in range(turns):
        store.append_transcript_messages(sid, [Message(role=Role.USER, content="x" * 600)])
        store.append_progress_entry(sid, make_entry(i))
        if i % 10 == 0:
            store.update_feature_pass(sid, f"f{i % 20 + 1}", i % 20 == 0)
            store.record_run_checkpoint(sid, make_checkpoint(f"run-{i}"))


def _truth(root: Path, sid: str) -> BootstrapState:
    """The state folded from the log alone (every cache moved away meanwhile)."""
    cache = _cache(root, sid)
    saved = cache.with_name("saved-aside")
    moved = cache.exists() or cache.is_symlink()
    if moved:
        os.rename(cache, saved)
    try:
        with SessionStore(root) as s:
            s.core.caches.cached = {}  # and write none
            return s.load_bootstrap_state(sid)
    finally:
        if moved:
            os.rename(saved, cache)


@pytest.fixture
def filled(root: Path) -> BootstrapState:
    with SessionStore(root) as s:
        _fill(s, "s")
        state = s.load_bootstrap_state("s")
    assert _cache(root, "s").is_file()
    return state


def test_close_writes_a_private_cache_and_a_cold_load_folds_nothing(
    root: Path, filled: BootstrapState, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert stat.S_IMODE(os.lstat(_cache(root, "s")).st_mode) == 0o600
    with SessionStore(root) as s:
        spy = LoadSpy(s, monkeypatch)
        assert s.load_bootstrap_state("s") == filled
        assert spy.decoders == 0 and spy.folded == 0  # no tail: no decoder, no fold
    assert filled == _truth(root, "s")


def test_a_cold_load_folds_only_the_tail(
    root: Path, filled: BootstrapState, monkeypatch: pytest.MonkeyPatch
) -> None:
    with SessionStore(root) as w:
        w.core.caches.cached = {}  # this writer leaves the cache as it was
        w.append_progress_entry("s", make_entry(999))
        w.append_transcript_messages("s", [Message(role=Role.ASSISTANT, content="tail")])
        tail = len(w.engine.read("s", None).data) - _logged_at_cache(root)
    with SessionStore(root) as s:
        spy = LoadSpy(s, monkeypatch)
        state = s.load_bootstrap_state("s")
        assert spy.folded == tail > 0
    assert state == _truth(root, "s")
    assert state.recent_progress[-1].summary == "step 999"


def _logged_at_cache(root: Path) -> int:
    header = _cache(root, "s").read_bytes().split(b"\n", 1)[0]
    return int(msgspec.json.decode(header)["offset"])


def test_a_tampered_tail_after_the_cached_position_is_still_caught(
    root: Path, filled: BootstrapState
) -> None:
    with SessionStore(root) as w:
        w.append_progress_entry("s", make_entry(999))
    log = log_path(root, "s")
    data = log.read_bytes()
    log.write_bytes(data.replace(b"step 999", b"step 998"))
    with SessionStore(root) as s, pytest.raises(CorruptLogError):
        s.load_bootstrap_state("s")


def _assert_ignored_and_rebuilt(root: Path, truth: BootstrapState) -> None:
    with SessionStore(root) as s:
        assert s.load_bootstrap_state("s") == truth
        assert s.cache_info("s").folds["bootstrap"][1] is None  # not from the cache
    with SessionStore(root) as s:  # the close above rebuilt it
        assert s.load_bootstrap_state("s") == truth
        assert s.cache_info("s").folds["bootstrap"][1] == s.last_seq("s")  # type: ignore[union-attr]


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_a_flipped_byte_anywhere_is_ignored(
    root: Path, filled: BootstrapState, data: st.DataObject
) -> None:
    cache = _cache(root, "s")
    good = cache.read_bytes()
    i = data.draw(st.integers(0, len(good) - 1), label="offset")
    bit = data.draw(st.integers(0, 7), label="bit")
    bad = bytearray(good)
    bad[i] ^= 1 << bit
    cache.write_bytes(bytes(bad))
    _assert_ignored_and_rebuilt(root, filled)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_a_truncated_cache_is_ignored(
    root: Path, filled: BootstrapState, data: st.DataObject
) -> None:
    cache = _cache(root, "s")
    good = cache.read_bytes()
    cache.write_bytes(good[: data.draw(st.integers(0, len(good) - 1), label="length")])
    _assert_ignored_and_rebuilt(root, filled)


def test_a_cache_swapped_in_from_another_session_is_ignored(
    root: Path, filled: BootstrapState
) -> None:
    with SessionStore(root) as s:
        _fill(s, "t", turns=125)
    shutil.copyfile(_cache(root, "t"), _cache(root, "s"))
    _assert_ignored_and_rebuilt(root, filled)


@pytest.mark.parametrize("replacer", ["compact", "repair", "remove"])
def test_a_stale_cache_after_a_replacement_is_ignored(
    root: Path, filled: BootstrapState, replacer: str
) -> None:
    stale = _cache(root, "s").read_bytes()
    with SessionStore(root) as s:
        if replacer == "compact":
            s.compact("s")
        elif replacer == "repair":
            from eventstore.ops.repair import repair

            with open(log_path(root, "s"), "ab") as f:
                f.write(b'{"torn')
            repair(s, "s")
        else:
            assert s.delete_session("s") is True
            assert not _cache(root, "s").parent.exists()  # removed with the session
            _fill(s, "s")
    truth = _truth(root, "s")
    _cache(root, "s").write_bytes(stale)
    _assert_ignored_and_rebuilt(root, truth)


def test_compaction_writes_a_cache_of_the_snapshot(root: Path, filled: BootstrapState) -> None:
    with SessionStore(root) as s:
        s.compact("s")
    with SessionStore(root) as s:
        assert s.load_bootstrap_state("s") == filled
        assert s.cache_info("s").folds["bootstrap"][1] == s.last_seq("s")  # type: ignore[union-attr]


def test_a_symlink_planted_in_its_place_is_never_followed(
    root: Path, filled: BootstrapState, tmp_path: Path
) -> None:
    cache = _cache(root, "s")
    target = tmp_path / "elsewhere"
    target.write_bytes(cache.read_bytes())  # even a valid cache, through a link
    cache.unlink()
    cache.symlink_to(target)
    _assert_ignored_and_rebuilt(root, filled)
    assert not cache.is_symlink() and cache.is_file()  # replaced, not written through
    assert target.read_bytes().startswith(b"{")


def test_a_fifo_planted_in_its_place_does_not_hang_a_load(
    root: Path, filled: BootstrapState
) -> None:
    cache = _cache(root, "s")
    cache.unlink()
    os.mkfifo(cache)
    _assert_ignored_and_rebuilt(root, filled)


def _rewrite(root: Path, change: dict[str, Any]) -> None:
    """Change the face header of the cache and recompute its digest: only the check of
    what the header says can reject it."""
    cache = _cache(root, "s")
    engine_head, rest = cache.read_bytes().split(b"\n", 1)
    body = rest[: -fold_cache._CHECKSUM_HEX - 1]
    header, state = body.split(b"\n", 1)
    fields = msgspec.json.decode(header)
    fields.update(change)
    body = msgspec.json.encode(fields) + b"\n" + state
    cache.write_bytes(engine_head + b"\n" + body + fold_cache._checksum([body]))


@pytest.mark.parametrize(
    "change",
    [{"version": 2}, {"projection": "other"}, {"session": "t"}, {"format": 99}, {"seq": 1}],
)
def test_a_cache_that_says_it_is_something_else_is_ignored(
    root: Path, filled: BootstrapState, change: dict[str, Any]
) -> None:
    _rewrite(root, change)
    _assert_ignored_and_rebuilt(root, filled)


def test_the_rewrite_helper_itself_keeps_a_cache_valid(root: Path, filled: BootstrapState) -> None:
    """The control for the test above: with no change, the rewritten cache is used."""
    _rewrite(root, {})
    with SessionStore(root) as s:
        assert s.load_bootstrap_state("s") == filled
        assert s.cache_info("s").folds["bootstrap"][1] == s.last_seq("s")  # type: ignore[union-attr]


def test_a_state_that_does_not_decode_is_ignored(root: Path, filled: BootstrapState) -> None:
    cache = _cache(root, "s")
    engine_head, rest = cache.read_bytes().split(b"\n", 1)
    header = rest.split(b"\n", 1)[0]
    body = header + b"\n" + b'{"feature_list":"not a list"}' + b"\n"
    cache.write_bytes(engine_head + b"\n" + body + fold_cache._checksum([body]))
    _assert_ignored_and_rebuilt(root, filled)


def test_small_sessions_and_unknown_ones_get_no_cache(root: Path) -> None:
    with SessionStore(root) as s:
        s.append_progress_entry("small", make_entry(0))
        assert s.load_bootstrap_state("small").recent_progress
        assert s.load_bootstrap_state("unknown") == BootstrapState()
    assert not _cache(root, "small").exists()
    assert not _cache(root, "unknown").parent.exists()


def test_a_long_fold_writes_the_cache_without_waiting_for_close(root: Path) -> None:
    with SessionStore(root) as w:
        w.core.caches.cached = {}
        w.append_progress_entry("s", make_entry(0))
        for _ in range(1100):
            w.append_transcript_messages("s", [Message(role=Role.USER, content="y" * 1000)])
    s = SessionStore(root)
    s.load_bootstrap_state("s")
    assert _cache(root, "s").is_file()  # before close
    s.close()


class _Counter(msgspec.Struct):
    n: int = 0


class _Counting(StructProjection[_Counter]):
    name = "counting"
    version = 1
    event_types = None
    state_type = _Counter
    cache_folds = True

    def initial(self) -> _Counter:
        return _Counter()

    def apply(self, state: _Counter, event: Event) -> _Counter:
        state.n += 1
        return state


class _Uncached(_Counting):
    name = "uncached"
    cache_folds = False


def test_a_projection_that_opts_in_is_cached_and_others_are_not(root: Path) -> None:
    with SessionStore(root, projections=[_Counting(), _Uncached()]) as s:
        _fill(s, "s")
        assert s.load("s", "counting").n == s.last_seq("s")
        assert s.load("s", "uncached").n == s.last_seq("s")
        s.load_transcript_messages("s")
    assert _cache(root, "s", "counting").is_file()
    assert _cache(root, "s", "transcript").is_file()  # the built-in transcript opts in
    assert not _cache(root, "s", "uncached").exists()
    with SessionStore(root, projections=[_Counting()]) as s:
        assert s.load("s", "counting").n == s.last_seq("s")
        assert s.cache_info("s").folds["counting"][1] == s.last_seq("s")  # type: ignore[union-attr]


def test_the_memory_engine_keeps_no_cache_and_loads_the_same() -> None:
    with SessionStore("memory://fold-cache-test") as s:
        _fill(s, "s")
        before = s.load_bootstrap_state("s")
        assert not isinstance(s.engine, CachingEngine)
    with SessionStore("memory://fold-cache-test") as s:
        assert s.load_bootstrap_state("s") == before


def test_a_cache_that_fails_to_write_fails_nothing(
    root: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(*a: object, **k: object) -> None:
        raise OSError(28, "No space left on device")

    with SessionStore(root) as s:
        _fill(s, "s")
        monkeypatch.setattr(s.engine, "store_cache", broken)
    assert "fold cache" in caplog.text
    with SessionStore(root) as s:
        assert s.load_bootstrap_state("s").manifest is not None


# -- loads read a long log piece by piece (Engine.read_some) ------------------------------


@pytest.mark.parametrize("piece", [1, 700, 5000])
def test_a_load_in_small_pieces_equals_one_in_one_piece(
    root: Path, monkeypatch: pytest.MonkeyPatch, piece: int
) -> None:
    with SessionStore(root) as s:
        _fill(s, "s", turns=30)
        s.append_transcript_messages(  # one batch far longer than a piece
            "s", [Message(role=Role.TOOL, content="z" * 3000) for _ in range(5)]
        )
    truth = _truth(root, "s")
    with SessionStore(root) as s:
        s.core.caches.cached = {}
        whole = s.load_transcript_messages("s")
    tune(monkeypatch, read_piece=piece)
    calls: list[bool] = []
    with SessionStore(root) as s:
        s.core.caches.cached = {}
        real = s.engine.read_some

        def counting(sid: str, position: Any, limit: int) -> Any:
            res, more = real(sid, position, limit)
            assert len(res.data) <= max(limit, 16_000)  # a piece, or one long batch
            calls.append(more)
            return res, more

        monkeypatch.setattr(s.engine, "read_some", counting)
        assert s.load_bootstrap_state("s") == truth
        assert s.load_transcript_messages("s") == whole
        assert s.verify("s").ok
    assert calls.count(True) > 2 and calls[-1] is False


def test_a_log_replaced_between_two_pieces_is_folded_from_its_start(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with SessionStore(root) as s:
        _fill(s, "s", turns=30)
    truth = _truth(root, "s")
    tune(monkeypatch, read_piece=2000)
    with SessionStore(root) as s, SessionStore(root) as other:
        s.core.caches.cached = other.core.caches.cached = {}
        real = s.engine.read_some
        done: list[int] = []

        def compact_after_the_first_piece(sid: str, position: Any, limit: int) -> Any:
            got = real(sid, position, limit)
            if not done:
                done.append(1)
                other.compact(sid)  # the log is replaced under the load
            return got

        monkeypatch.setattr(s.engine, "read_some", compact_after_the_first_piece)
        assert s.load_bootstrap_state("s") == truth
        assert done


def test_an_engine_without_pieces_loads_in_one_read() -> None:
    with SessionStore("memory://pieces") as s:
        _fill(s, "s", turns=5)
        res, more = s.engine.read_some("s", None, 10)
        assert more is False and res.head.seq == s.last_seq("s")
