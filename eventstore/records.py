"""The domain records a harness stores: msgspec Structs, built by keyword, equal by value.

These are the seed API's types. Timestamps are timezone-aware; a naive datetime given
to a record is rejected at write time (see `eventstore.events`).
"""

from __future__ import annotations

import enum
from datetime import UTC, datetime
from typing import Annotated

import msgspec

__all__ = [
    "BootstrapState",
    "FeatureRecord",
    "InitCommand",
    "InitPlan",
    "InitShell",
    "InitShellScript",
    "Message",
    "ProgressEntry",
    "Role",
    "RunCheckpoint",
    "RunStatus",
    "SessionManifest",
    "AwareDatetime",
    "utc_now",
]

#: A datetime that must carry a timezone; naive ones are rejected when written.
AwareDatetime = Annotated[datetime, msgspec.Meta(tz=True)]


def utc_now() -> datetime:
    """The current time, timezone-aware (UTC)."""
    return datetime.now(UTC)


class RunStatus(enum.Enum):
    """How a run stands."""

    IN_PROGRESS = "in_progress"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


class InitShell(enum.Enum):
    """The shell an `InitShellScript` runs in."""

    BASH = "bash"
    SH = "sh"
    PWSH = "pwsh"
    CMD = "cmd"


class Role(enum.Enum):
    """Who wrote a transcript message."""

    SYSTEM = "system"
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"


class FeatureRecord(msgspec.Struct):
    """One entry of the feature list; `passes` flips as the harness works."""

    id: str
    category: str
    description: str
    steps: list[str]
    passes: bool


class ProgressEntry(msgspec.Struct, frozen=True):
    """A progress note written by a run. Frozen: an entry is a fact in an append-only log
    (use `msgspec.structs.replace` for an edited copy)."""

    run_id: str
    summary: str
    created_at: AwareDatetime = msgspec.field(default_factory=utc_now)


class RunCheckpoint(msgspec.Struct, frozen=True):
    """The state of one run: when it started, how it ended. Frozen, like ProgressEntry:
    record a new checkpoint (e.g. `msgspec.structs.replace(cp, status=...)`) to move on."""

    run_id: str
    started_at: AwareDatetime = msgspec.field(default_factory=utc_now)
    completed_at: AwareDatetime | None = None
    status: RunStatus = RunStatus.IN_PROGRESS
    note: str | None = None


class InitCommand(msgspec.Struct, tag_field="kind", tag="command"):
    """An init step that runs a program with arguments."""

    program: str
    args: list[str] = msgspec.field(default_factory=list)


class InitShellScript(msgspec.Struct, tag_field="kind", tag="shell_script"):
    """An init step that runs a script in a shell."""

    shell: InitShell
    script: str


class InitPlan(msgspec.Struct):
    """The steps that bring a fresh checkout to a working state."""

    steps: list[InitCommand | InitShellScript] = msgspec.field(default_factory=list)


class SessionManifest(msgspec.Struct):
    """What a session is for and where it stands."""

    session_id: str
    active_branch: str
    current_objective: str
    schema_version: int = 1
    harness_version: str = "v0"
    last_known_good_commit: str | None = None
    init_plan: InitPlan | None = None
    metadata: dict[str, str] = msgspec.field(default_factory=dict)


class Message(msgspec.Struct, frozen=True):
    """One transcript message. Frozen: transcripts are shared, never edited in place."""

    role: Role
    content: str


class BootstrapState(msgspec.Struct):
    """Everything a harness reads when it starts a new context window."""

    manifest: SessionManifest | None = None
    feature_list: list[FeatureRecord] = msgspec.field(default_factory=list)
    recent_progress: list[ProgressEntry] = msgspec.field(default_factory=list)
    checkpoints: list[RunCheckpoint] = msgspec.field(default_factory=list)
