"""Correctness mode: every backend runs the same small workload and must agree.

Besides the turn loop, the check covers all ten operations and the contract's edge
cases: a second initialization returns False, an unknown feature raises
`FeatureNotFoundError` and writes nothing, unknown sessions load empty, and a store
reopened from disk gives the same answers.
"""

from __future__ import annotations

import tempfile
from typing import Any

import msgspec

from eventstore.errors import FeatureNotFoundError
from eventstore.store import AppendResult

from .backends import BACKENDS, available, open_backend
from .workload import Op, SessionBackend, Workload, apply_op

__all__ = ["observe", "run_check"]

SID = "bench-session"
ODD_SID = "odd id/with ✓ and ../dots"


def _contract(value: Any) -> Any:
    """A write's return as the older contract has it: nothing (eventstore's writers also
    return their AppendResult, which the other backends have no counterpart of)."""
    return None if isinstance(value, AppendResult) else value


def observe(store_factory: Any, turns: int, seed: int = 11) -> dict[str, Any]:
    """Everything the check compares, gathered from one backend."""
    wl = Workload(turns, seed=seed, features=30)
    out: dict[str, Any] = {}
    store: SessionBackend = store_factory()
    try:
        out["init_before"] = store.is_initialized(SID)
        out["empty_state"] = store.load_bootstrap_state("never-seen")
        out["empty_transcript"] = store.load_transcript_messages("never-seen")
        out["returns"] = [_contract(apply_op(store, SID, op)) for op in wl.ops]
        out["state_after_turns"] = store.load_bootstrap_state(SID)
        out["init_after"] = store.is_initialized(SID)
        first = wl.ops[0]
        out["second_init"] = apply_op(store, SID, first)
        try:
            store.update_feature_pass(SID, "no-such-feature", True)
            out["missing_feature"] = "no error"
        except FeatureNotFoundError as exc:
            out["missing_feature"] = (type(exc).__name__, isinstance(exc, KeyError))
        extra = []
        for op in wl.extra_contract_ops():
            extra.append((_contract(apply_op(store, SID, op)), store.load_bootstrap_state(SID)))
        out["extra_returns"] = extra
        # a manifest names its session: the odd session gets its own
        manifest = msgspec.structs.replace(first.args[0], session_id=ODD_SID)
        out["odd_init"] = apply_op(store, ODD_SID, Op(first.name, (manifest, *first.args[1:])))
        store.append_transcript_messages(ODD_SID, list(wl.ops[1].args[0]))
        out["state"] = store.load_bootstrap_state(SID)
        out["transcript"] = store.load_transcript_messages(SID)
        out["odd_state"] = store.load_bootstrap_state(ODD_SID)
        out["odd_transcript"] = store.load_transcript_messages(ODD_SID)
    finally:
        store.close()
    reopened: SessionBackend = store_factory()
    try:
        out["reopened_state"] = reopened.load_bootstrap_state(SID)
        out["reopened_transcript"] = reopened.load_transcript_messages(SID)
        out["reopened_init"] = reopened.is_initialized(ODD_SID)
    finally:
        reopened.close()
    return out


def run_check(
    turns: int = 60, backends: list[str] | None = None, reference: str = "eventstore-flush"
) -> tuple[list[str], list[str], list[str]]:
    """Run the check; returns (backends that agreed, mismatch messages, skipped backends)."""
    names = list(backends or BACKENDS)
    if reference not in names:
        names.insert(0, reference)
    skipped = [n for n in names if not available(n)]
    results: dict[str, dict[str, Any]] = {}
    for name in names:
        if name in skipped:
            continue
        with tempfile.TemporaryDirectory(prefix=f"bench-check-{name}-") as root:
            results[name] = observe(lambda n=name, r=root: open_backend(n, r), turns)
    ref = results[reference]
    ok: list[str] = []
    problems: list[str] = []
    for name, res in results.items():
        bad = [k for k in ref if res.get(k) != ref[k]]
        if bad:
            for k in bad:
                problems.append(f"{name}: {k} differs from {reference}: {_short(res.get(k))}")
        else:
            ok.append(name)
    if ref["state"] != ref["reopened_state"] or ref["transcript"] != ref["reopened_transcript"]:
        problems.append(f"{reference}: state changed after reopening")
    return ok, problems, skipped


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) < 300 else text[:300] + "..."
