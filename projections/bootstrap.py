"""The bootstrap projection: events -> `BootstrapState`, what a harness reads at start."""

# no `from __future__ import annotations`: msgspec reads these structs' annotations
# as objects, not strings to evaluate; that keeps decoder builds on cold loads ~3x cheaper
from collections.abc import Callable

import msgspec

from eventstore.format.events import (
    CheckpointRecorded,
    Event,
    FeatureListReplaced,
    FeaturePassUpdated,
    ManifestSet,
    ProgressAppended,
)
from eventstore.records import (
    BootstrapState,
    FeatureRecord,
    SessionManifest,
)
from projections.base import (
    Retention,
    StructProjection,
    is_suffix,
    keep_last,
)

__all__ = ["BootstrapProjection"]


def _manifest(state: BootstrapState, ev: ManifestSet) -> None:
    state.manifest = ev.manifest


def _features(state: BootstrapState, ev: FeatureListReplaced) -> None:
    state.feature_list = list(ev.features)


_replace = msgspec.structs.replace
_MANIFEST = msgspec.json.Decoder(SessionManifest)


def _copy_manifest(value: SessionManifest) -> SessionManifest:
    return _MANIFEST.decode(msgspec.json.encode(value))


def _copy_features(features: list[FeatureRecord]) -> list[FeatureRecord]:
    # a FeatureRecord's only mutable part is its `steps` list (the rest is str and bool):
    # 8x cheaper than a JSON round trip, and most of a cold bootstrap load's copy
    return [_replace(f, steps=list(f.steps)) for f in features]


def _progress(state: BootstrapState, ev: ProgressAppended) -> None:
    state.recent_progress.append(ev.entry)


def _checkpoint(state: BootstrapState, ev: CheckpointRecorded) -> None:
    state.checkpoints.append(ev.checkpoint)


_HANDLERS: dict[type[Event], Callable[[BootstrapState, Event], None]] = {
    ManifestSet: _manifest,  # type: ignore[dict-item]
    FeatureListReplaced: _features,  # type: ignore[dict-item]
    ProgressAppended: _progress,  # type: ignore[dict-item]
    CheckpointRecorded: _checkpoint,  # type: ignore[dict-item]
}


class BootstrapProjection(StructProjection[BootstrapState]):
    """Manifest, feature list, progress and checkpoints; never touches the transcript."""

    name = "bootstrap"
    version = 1
    event_types = frozenset(
        {
            "manifest_set",
            "feature_list_replaced",
            "feature_pass_updated",
            "progress_appended",
            "checkpoint_recorded",
        }
    )
    state_type = BootstrapState
    ignores_other_types = True  # a writer skips batches of no type it reads

    def __init__(self) -> None:
        # the positions of each feature id in the last feature list a pass update was
        # folded into. A fold only replaces entries in place (ids keep their positions)
        # or replaces the whole list, so the memo holds while its list object is the
        # state's; it keeps that list alive, so identity cannot be confused with a new
        # list at the same address. Per projection instance: no state is shared
        # between stores.
        self._positions: tuple[list[FeatureRecord], dict[str, list[int]]] = ([], {})

    def initial(self) -> BootstrapState:
        """An empty state."""
        return BootstrapState()

    def apply(self, state: BootstrapState, event: Event) -> BootstrapState:
        """Fold one event into the state."""
        if type(event) is FeaturePassUpdated:
            self._pass(state, event)
            return state
        handler = _HANDLERS.get(type(event))
        if handler is not None:
            handler(state, event)
        return state

    def has_feature(self, state: BootstrapState, feature_id: str) -> bool:
        """Whether the state's feature list holds `feature_id` (without a scan)."""
        return feature_id in self._index(state.feature_list)

    def _pass(self, state: BootstrapState, ev: FeaturePassUpdated) -> None:
        # records are shared with decoded events and copies: replace, never mutate
        features = state.feature_list
        for i in self._index(features).get(ev.feature_id, ()):
            features[i] = msgspec.structs.replace(features[i], passes=ev.passes)

    def _index(self, features: list[FeatureRecord]) -> dict[str, list[int]]:
        memo = self._positions  # read once: another thread may swap it
        if memo[0] is not features:
            index: dict[str, list[int]] = {}
            for i, f in enumerate(features):
                index.setdefault(f.id, []).append(i)
            memo = self._positions = (features, index)
        return memo[1]

    def retain(self, state: BootstrapState, retention: Retention) -> BootstrapState:
        """Keep the newest `retention.progress` entries and `retention.checkpoints`."""
        return BootstrapState(
            manifest=state.manifest,
            feature_list=state.feature_list,
            recent_progress=keep_last(state.recent_progress, retention.progress),
            checkpoints=keep_last(state.checkpoints, retention.checkpoints),
        )

    def retained_from(self, stored: BootstrapState, full: BootstrapState) -> bool:
        """Manifest and features equal; progress and checkpoints the newest of `full`'s."""
        return (
            stored.manifest == full.manifest
            and stored.feature_list == full.feature_list
            and is_suffix(stored.recent_progress, full.recent_progress)
            and is_suffix(stored.checkpoints, full.checkpoints)
        )

    def copy(self, state: BootstrapState) -> BootstrapState:
        """A state the caller may change: manifest and features copied, the rest shared."""
        # progress entries and checkpoints are frozen (and hold nothing mutable): share
        # them, so a copy costs the manifest and the features, not the whole history
        return BootstrapState(
            manifest=None if state.manifest is None else _copy_manifest(state.manifest),
            feature_list=_copy_features(state.feature_list),
            recent_progress=list(state.recent_progress),
            checkpoints=list(state.checkpoints),
        )
