"""`tune`: small read pieces and hash thresholds for every store a test opens, through the
documented hook `eventstore.core.tuning.DEFAULT_TUNING` (restored after the test)."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from eventstore.core import tuning


def tune(monkeypatch: pytest.MonkeyPatch, **sizes: Any) -> None:
    """Stores opened from now on in this test use `sizes` (fields of `Tuning`)."""
    monkeypatch.setattr(
        tuning, "DEFAULT_TUNING", msgspec.structs.replace(tuning.DEFAULT_TUNING, **sizes)
    )
