"""The domain records a harness stores: msgspec Structs, built by keyword, equal by value.

These are the seed API's types. Timestamps are timezone-aware; a naive datetime given
to a record is rejected at write time (see `eventstore.format.codec`).
"""

# no `from __future__ import annotations`: msgspec reads these structs' annotations
# as objects, not strings to evaluate; that keeps decoder builds on cold loads ~3x cheaper
import enum
from datetime import datetime
from typing import Annotated, Any

import msgspec

from eventstore import entropy

__all__ = [
    "BootstrapState",
    "ContentBlock",
    "FeatureRecord",
    "ImageBlock",
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
    "TextBlock",
    "ThinkingBlock",
    "text_of",
    "ToolResultBlock",
    "ToolUseBlock",
    "AwareDatetime",
    "utc_now",
]

#: A datetime that must carry a timezone; naive ones are rejected when written.
AwareDatetime = Annotated[datetime, msgspec.Meta(tz=True)]


def utc_now() -> datetime:
    """The current time, timezone-aware (UTC)."""
    return entropy.now()


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


# -- transcript messages ------------------------------------------------------------------
#
# Every field added to a message since `Message(role, content)` has a default and is
# omitted from the log while it holds it (omit_defaults), so a message built from role and
# content alone is written byte for byte as before, and old lines read as such messages.
# `content` keeps no default: an old writer's `"content":""` must stay in the line.


class TextBlock(
    msgspec.Struct, frozen=True, omit_defaults=True, tag_field="type", tag="text", gc=False
):
    """A piece of text in a message's structured content."""

    text: str


class ThinkingBlock(
    msgspec.Struct, frozen=True, omit_defaults=True, tag_field="type", tag="thinking", gc=False
):
    """A model's visible reasoning; `signature` is the provider's opaque seal, if any."""

    thinking: str
    signature: str | None = None


class ImageBlock(
    msgspec.Struct, frozen=True, omit_defaults=True, tag_field="type", tag="image", gc=False
):
    """A reference to an image, not its bytes: `source` is a URL, a path or a content
    hash such as `sha256:<hex>`; `media_type` e.g. `image/png`."""

    source: str
    media_type: str | None = None


class ToolUseBlock(
    msgspec.Struct, frozen=True, omit_defaults=True, tag_field="type", tag="tool_use", gc=False
):
    """A tool call: `id` pairs it with its result, `input` holds the JSON arguments."""

    id: str
    name: str
    input: dict[str, Any] = msgspec.field(default_factory=dict)


class ToolResultBlock(
    msgspec.Struct, frozen=True, omit_defaults=True, tag_field="type", tag="tool_result", gc=False
):
    """The result of the tool call whose id is `tool_use_id`: text, or text and images."""

    tool_use_id: str
    content: str | list[TextBlock | ImageBlock] = ""
    is_error: bool = False


#: One block of a message's structured content, tagged by `type` in the log.
ContentBlock = TextBlock | ThinkingBlock | ImageBlock | ToolUseBlock | ToolResultBlock


def text_of(blocks: list[ContentBlock]) -> str:
    """The text blocks among `blocks`, joined by newlines: the `content` a message with
    blocks conventionally carries (what importers write)."""
    return "\n".join(b.text for b in blocks if type(b) is TextBlock)


class Message(msgspec.Struct, frozen=True, omit_defaults=True, gc=False):
    """One transcript message. Frozen: transcripts are shared, never edited in place.

    `content` is the message's plain text (what a reader that knows only text shows).
    The optional fields: `name` (of the tool or participant that wrote it), `blocks`
    (structured content in order: text, tool calls, tool results, thinking, image
    references), `created_at` (when the message was written, as opposed to appended)
    and `metadata` (JSON values). Tool calls are `ToolUseBlock`s and tool results
    `ToolResultBlock`s; `tool_calls` and `tool_results` list them.

    Messages and their blocks are not tracked by the cyclic garbage collector (msgspec's
    `gc=False`): they hold JSON values, so a transcript of thousands of them costs no
    collection passes when it is loaded (20 % of a cold load of 20,000 messages). The
    one thing this rules out is a message made to contain itself (through `metadata` or
    a block's `input`), which would never be freed.
    """

    role: Role
    content: str
    name: str | None = None
    blocks: list[ContentBlock] = msgspec.field(default_factory=list)
    created_at: AwareDatetime | None = None
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)

    @property
    def tool_calls(self) -> list[ToolUseBlock]:
        """The tool calls among `blocks`, in order."""
        return [b for b in self.blocks if type(b) is ToolUseBlock]

    @property
    def tool_results(self) -> list[ToolResultBlock]:
        """The tool results among `blocks`, in order."""
        return [b for b in self.blocks if type(b) is ToolResultBlock]


class BootstrapState(msgspec.Struct):
    """Everything a harness reads when it starts a new context window."""

    manifest: SessionManifest | None = None
    feature_list: list[FeatureRecord] = msgspec.field(default_factory=list)
    recent_progress: list[ProgressEntry] = msgspec.field(default_factory=list)
    checkpoints: list[RunCheckpoint] = msgspec.field(default_factory=list)
