"""Hypothesis strategies for every record and every built-in event type.

Importable by any test module (``from strategies import ...``; pytest puts ``tests/`` on
``sys.path``). Text is arbitrary Unicode (no lone surrogates, which UTF-8 cannot carry);
datetimes are aware, with UTC and non-UTC offsets of whole minutes.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import msgspec
from hypothesis import strategies as st

from eventstore import (
    CheckpointRecorded,
    FeatureListReplaced,
    FeaturePassUpdated,
    FeatureRecord,
    InitCommand,
    InitPlan,
    InitShell,
    InitShellScript,
    ManifestSet,
    Message,
    MessagesAppended,
    ProgressAppended,
    ProgressEntry,
    Role,
    RunCheckpoint,
    RunStatus,
    SessionManifest,
    Snapshot,
)
from eventstore.records import (
    BootstrapState,
    ImageBlock,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from projections import (
    BootstrapProjection,
    TranscriptProjection,
    snapshot_entry,
)

__all__ = [
    "aware_datetimes",
    "bootstrap_states",
    "builtin_events",
    "checkpoints",
    "feature_lists",
    "features",
    "init_plans",
    "lone_surrogated",
    "manifests",
    "messages",
    "progress_entries",
    "rich_messages",
    "snapshots",
    "texts",
]

# Every Unicode code point UTF-8 can encode (surrogates excluded), NUL and controls included.
_chars = st.characters(codec="utf-8")
texts = st.text(_chars, max_size=24)
short_ids = st.text(_chars, min_size=1, max_size=12)
# a str holding a lone surrogate: no UTF-8, so no session id or log line, can carry it
lone_surrogated = st.builds(
    "".join,
    st.tuples(
        st.text(max_size=4),
        st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF),
        st.text(max_size=4),
    ),
)

# Fixed offsets in whole minutes strictly inside (-24h, +24h); UTC itself included.
offsets = st.one_of(
    st.just(UTC),
    st.integers(min_value=-(24 * 60 - 1), max_value=24 * 60 - 1).map(
        lambda m: timezone(timedelta(minutes=m))
    ),
)

#: Aware datetimes (microsecond precision) in a range that survives any offset.
aware_datetimes = st.datetimes(
    min_value=datetime(1900, 1, 2), max_value=datetime(2200, 12, 30), timezones=offsets
)

features = st.builds(
    FeatureRecord,
    id=short_ids,
    category=texts,
    description=texts,
    steps=st.lists(texts, max_size=4),
    passes=st.booleans(),
)

#: Feature lists with unique ids (the contract addresses a feature by its id).
feature_lists = st.lists(features, max_size=6, unique_by=lambda f: f.id)

progress_entries = st.builds(ProgressEntry, run_id=texts, summary=texts, created_at=aware_datetimes)

checkpoints = st.builds(
    RunCheckpoint,
    run_id=texts,
    started_at=aware_datetimes,
    completed_at=st.none() | aware_datetimes,
    status=st.sampled_from(RunStatus),
    note=st.none() | texts,
)

init_commands = st.builds(InitCommand, program=texts, args=st.lists(texts, max_size=4))
init_shell_scripts = st.builds(InitShellScript, shell=st.sampled_from(InitShell), script=texts)

#: Init plans mixing both step kinds (and, sometimes, no step at all).
init_plans = st.builds(
    InitPlan, steps=st.lists(st.one_of(init_commands, init_shell_scripts), max_size=5)
)


def manifests(session_id: st.SearchStrategy[str] = short_ids) -> st.SearchStrategy[SessionManifest]:
    """Manifests with every optional field sometimes set."""
    return st.builds(
        SessionManifest,
        session_id=session_id,
        active_branch=texts,
        current_objective=texts,
        schema_version=st.integers(min_value=-(2**63), max_value=2**63 - 1),
        harness_version=texts,
        last_known_good_commit=st.none() | texts,
        init_plan=st.none() | init_plans,
        metadata=st.dictionaries(texts, texts, max_size=4),
    )


messages = st.builds(Message, role=st.sampled_from(Role), content=texts)

#: JSON values as a log gives them back: integers of any size (past 64 bits too), finite
#: floats, text, lists and objects.
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | texts,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=6,
)
_blocks = st.one_of(
    st.builds(TextBlock, text=texts),
    st.builds(ThinkingBlock, thinking=texts, signature=st.none() | texts),
    st.builds(ImageBlock, source=texts, media_type=st.none() | texts),
    st.builds(
        ToolUseBlock, id=texts, name=texts, input=st.dictionaries(texts, json_values, max_size=3)
    ),
    st.builds(
        ToolResultBlock,
        tool_use_id=texts,
        content=texts | st.lists(st.builds(TextBlock, text=texts), max_size=2),
        is_error=st.booleans(),
    ),
)
#: Messages with every optional field: a name, blocks of every kind, a time with any
#: offset, JSON metadata.
rich_messages = st.builds(
    Message,
    role=st.sampled_from(Role),
    content=texts,
    name=st.none() | texts,
    blocks=st.lists(_blocks, max_size=3),
    created_at=st.none() | aware_datetimes,
    metadata=st.dictionaries(texts, json_values, max_size=3),
)

bootstrap_states = st.builds(
    BootstrapState,
    manifest=st.none() | manifests(),
    feature_list=feature_lists,
    recent_progress=st.lists(progress_entries, max_size=3),
    checkpoints=st.lists(checkpoints, max_size=3),
)

_hex16 = st.text("0123456789abcdef", min_size=16, max_size=16)


@st.composite
def snapshots(draw: st.DrawFn) -> Snapshot:
    """A snapshot holding real projection states (as compaction would write them)."""
    state = draw(bootstrap_states)
    transcript = draw(st.lists(messages, max_size=3))
    unknown = draw(
        st.lists(
            st.dictionaries(st.text(max_size=5), st.integers() | texts, max_size=3).map(
                lambda d: msgspec.Raw(msgspec.json.encode(d))
            ),
            max_size=2,
        )
    )
    return Snapshot(
        base_h=draw(_hex16),
        states={
            "bootstrap": snapshot_entry(BootstrapProjection(), state),
            "transcript": snapshot_entry(TranscriptProjection(), transcript),
        },
        unknown=unknown,
    )


#: Every built-in event type but the snapshot, payloads unstamped (as a caller builds them).
payload_events = st.one_of(
    st.builds(ManifestSet, manifest=manifests()),
    st.builds(FeatureListReplaced, features=feature_lists),
    st.builds(FeaturePassUpdated, feature_id=texts, passes=st.booleans()),
    st.builds(ProgressAppended, entry=progress_entries),
    st.builds(CheckpointRecorded, checkpoint=checkpoints),
    st.builds(MessagesAppended, messages=st.lists(messages, max_size=4)),
)

#: Every built-in event type, the snapshot included.
builtin_events = st.one_of(payload_events, snapshots())
