"""A deterministic, seeded workload of realistic harness turns.

A session starts with a manifest (init plan, metadata) and 200 features (descriptions of
about 120 characters, 3-6 steps); then every turn appends two transcript messages (about
300 and 1,500 characters) in one call, every 5th turn a progress entry, every 10th a
feature pass update and every 20th a run checkpoint. Every record, timestamp and text is
derived from the seed, so every backend sees exactly the same operations.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from eventstore.records import (
    BootstrapState,
    FeatureRecord,
    InitCommand,
    InitPlan,
    InitShell,
    InitShellScript,
    Message,
    ProgressEntry,
    Role,
    RunCheckpoint,
    RunStatus,
    SessionManifest,
)

__all__ = [
    "Op",
    "SessionBackend",
    "Workload",
    "WRITE_OPS",
    "apply_op",
    "make_features",
    "make_manifest",
]

#: The operations that write; everything the workload emits is one of these.
WRITE_OPS = frozenset(
    {
        "initialize_session_if_missing",
        "save_manifest",
        "append_progress_entry",
        "replace_feature_list",
        "update_feature_pass",
        "record_run_checkpoint",
        "append_transcript_messages",
    }
)

_START = datetime(2026, 1, 5, 9, 0, 0, tzinfo=UTC)
_PROSE = (
    "the a of to and in is for that with on as by it be this are from at or an was not "
    "feature test run build commit branch session harness agent context window error fix "
    "passes fails step check module function parse write read load store event log state "
    "python rust json file lock append replace update record checkpoint progress manifest "
    "objective plan init shell command script result output input value config retry "
    "timeout cache index query table row column schema version migrate deploy review"
)
_WORDS = _PROSE.split()


class SessionBackend(Protocol):
    """The ten session operations every backend implements with identical behaviour."""

    def is_initialized(self, session_id: str) -> bool: ...

    def initialize_session_if_missing(
        self,
        session_id: str,
        manifest: SessionManifest,
        feature_list: list[FeatureRecord],
        initial_progress_entry: ProgressEntry | None = None,
        initial_checkpoint: RunCheckpoint | None = None,
    ) -> bool: ...

    def load_bootstrap_state(self, session_id: str) -> BootstrapState: ...

    def save_manifest(self, session_id: str, manifest: SessionManifest) -> None: ...

    def append_progress_entry(self, session_id: str, entry: ProgressEntry) -> None: ...

    def replace_feature_list(self, session_id: str, features: list[FeatureRecord]) -> None: ...

    def update_feature_pass(self, session_id: str, feature_id: str, passes: bool) -> None: ...

    def record_run_checkpoint(self, session_id: str, checkpoint: RunCheckpoint) -> None: ...

    def load_transcript_messages(self, session_id: str) -> list[Message]: ...

    def append_transcript_messages(self, session_id: str, messages: list[Message]) -> None: ...

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Op:
    """One session operation: the method name and its arguments after the session id."""

    name: str
    args: tuple[Any, ...]


def apply_op(store: SessionBackend, session_id: str, op: Op) -> Any:
    """Run `op` against `store` for `session_id`; returns what the method returned."""
    return getattr(store, op.name)(session_id, *op.args)


class _Text:
    """Deterministic prose: slices of one seeded corpus of words, cut at word edges."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.corpus = " ".join(rng.choices(_WORDS, k=60_000))

    def take(self, n: int) -> str:
        if n <= 0:
            return ""
        n = min(n, len(self.corpus) - 1)
        start = self.rng.randrange(0, len(self.corpus) - n)
        return self.corpus[start : start + n].strip() or "x"


def make_manifest(session_id: str, rng: random.Random, text: _Text, n: int = 0) -> SessionManifest:
    """A manifest with an init plan and metadata (`n` varies it for later saves)."""
    return SessionManifest(
        session_id=session_id,
        active_branch=f"feature/bench-{n}",
        current_objective=text.take(200),
        schema_version=1,
        harness_version="v0",
        last_known_good_commit=f"{rng.getrandbits(160):040x}" if n else None,
        init_plan=InitPlan(
            steps=[
                InitCommand(program="uv", args=["sync", "--frozen"]),
                InitShellScript(shell=InitShell.BASH, script="make build && make test -k"),
                InitCommand(program="npm", args=["ci"]),
                InitShellScript(shell=InitShell.PWSH, script="Write-Host ready"),
            ]
        ),
        metadata={"model": "bench-model", "harness": "bench", "round": str(n), "owner": "ci"},
    )


def make_features(rng: random.Random, text: _Text, count: int = 200) -> list[FeatureRecord]:
    """`count` features: ~120-character descriptions, 3-6 steps each."""
    cats = ["functional", "ui", "api", "storage", "security", "performance"]
    return [
        FeatureRecord(
            id=f"feat-{i:04d}",
            category=cats[i % len(cats)],
            description=text.take(120),
            steps=[text.take(rng.randint(30, 60)) for _ in range(rng.randint(3, 6))],
            passes=False,
        )
        for i in range(count)
    ]


@dataclass
class Workload:
    """The operations of one benchmark session, generated from `seed`.

    `msg_scale` multiplies the transcript message sizes (1.0: ~300 and ~1,500 chars);
    `features` is the size of the feature list.
    """

    turns: int
    seed: int = 7
    msg_scale: float = 1.0
    features: int = 200
    ops: list[Op] = field(init=False)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)
        self._text = _Text(self._rng)
        self._feature_ids: list[str] = []
        self._turn = 0
        self.ops = [self._init_op()]
        self.ops.extend(self._turn_ops(self.turns))

    def _init_op(self) -> Op:
        rng, text = self._rng, self._text
        feats = make_features(rng, text, self.features)
        self._feature_ids = [f.id for f in feats]
        return Op(
            "initialize_session_if_missing",
            (
                make_manifest("bench-session", rng, text),
                feats,
                ProgressEntry(run_id="run-0000", summary="session created", created_at=_START),
                RunCheckpoint(run_id="run-0000", started_at=_START),
            ),
        )

    def _turn_ops(self, count: int) -> Iterator[Op]:
        rng, text, s = self._rng, self._text, self.msg_scale
        for _ in range(count):
            self._turn += 1
            t = self._turn
            now = _START + timedelta(seconds=30 * t)
            user = Message(role=Role.USER, content=text.take(int(rng.gauss(300, 40) * s)))
            reply = Message(role=Role.ASSISTANT, content=text.take(int(rng.gauss(1500, 200) * s)))
            yield Op("append_transcript_messages", ([user, reply],))
            if t % 5 == 0:
                entry = ProgressEntry(
                    run_id=f"run-{t // 20:04d}", summary=text.take(160), created_at=now
                )
                yield Op("append_progress_entry", (entry,))
            if t % 10 == 0:
                fid = rng.choice(self._feature_ids)
                yield Op("update_feature_pass", (fid, rng.random() < 0.8))
            if t % 20 == 0:
                cp = RunCheckpoint(
                    run_id=f"run-{t // 20:04d}",
                    started_at=now - timedelta(minutes=10),
                    completed_at=now,
                    status=RunStatus.SUCCEEDED if rng.random() < 0.9 else RunStatus.FAILED,
                    note=text.take(80) if rng.random() < 0.5 else None,
                )
                yield Op("record_run_checkpoint", (cp,))

    def more_ops(self, k: int) -> list[Op]:
        """The next `k` operations, continuing the same session (for warm-load tests)."""
        out: list[Op] = []
        while len(out) < k:
            out.extend(self._turn_ops(1))
        return out[:k]

    def extra_contract_ops(self) -> list[Op]:
        """Ops the turn loop never emits, so a check covers all ten operations."""
        rng, text = self._rng, self._text
        feats = make_features(rng, text, 12)
        feats[3] = FeatureRecord(
            id=feats[3].id,
            category="unicode ✓",
            description='naïve — 日本語 "quoted" \\ back\nslash',
            steps=[],
            passes=True,
        )
        return [
            Op("save_manifest", (make_manifest("bench-session", rng, text, n=1),)),
            Op("replace_feature_list", (feats,)),
            Op("update_feature_pass", (feats[5].id, True)),
            Op("save_manifest", (SessionManifest("bench-session", "main", "plain"),)),
            Op(
                "append_transcript_messages",
                ([Message(Role.SYSTEM, ""), Message(Role.TOOL, "tool ✓ \u0000 out")],),
            ),
        ]


def put_values(saver: Any, thread_id: str, values: list[str]) -> list[Any]:
    """Put one checkpoint per value on a thread (one channel `v`), each a new version;
    the config each put returned."""
    from langgraph.checkpoint.base import empty_checkpoint  # (the langgraph extra)

    cfg: Any = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
    version: Any = None
    configs: list[Any] = []
    for v in values:
        cp = empty_checkpoint()
        version = saver.get_next_version(version, None)
        cp["channel_values"] = {"v": v}
        cp["channel_versions"] = {"v": version}
        cfg = saver.put(cfg, cp, {"source": "loop", "step": 0}, {"v": version})
        configs.append(cfg)
    return configs
