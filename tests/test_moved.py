"""Release 0.1.0's module paths still import after the move into packages per layer
(eventstore.moved): the same module objects, or a thin re-export where one module became
several, and what a 0.1.0 user called through them still works."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from eventstore import ProgressEntry, SessionStore
from eventstore.moved import MOVED


@pytest.mark.parametrize("old", sorted(MOVED))
def test_every_old_path_imports_what_moved(old: str) -> None:
    module = importlib.import_module(old)
    targets = [importlib.import_module(t) for t in MOVED[old]]
    if len(targets) == 1:
        assert module is targets[0]
    else:
        for target in targets:
            for name in target.__all__:
                assert getattr(module, name) is getattr(target, name), name


def test_a_0_1_0_program_runs_unchanged(tmp_path: Path) -> None:
    from eventstore.events import EventCodec, ProgressAppended, line_hash  # noqa: F401
    from eventstore.history import first_kept_seq
    from eventstore.lifecycle import delete_older_than, prune_archive
    from eventstore.verify import verify

    with SessionStore(tmp_path / "store") as store:
        for i in range(4):
            store.append_progress_entry("s", ProgressEntry(run_id="r", summary=str(i)))
            store.compact("s", force=True)
        assert prune_archive(store, "s", 3).segments  # the 0.1.0 call shape: the store
        assert first_kept_seq(store, "s") > 1
        assert verify(store, "s").ok
        assert delete_older_than(store, __import__("datetime").timedelta(days=1)) == []


def test_an_unknown_old_name_is_still_an_import_error() -> None:
    with pytest.raises(ImportError):
        importlib.import_module("eventstore.no_such_module")
