"""The ADK session-service workload, shared by `bench.integrations` (against ADK's SQLite
services) and `bench.redis` (against ADK's `RedisSessionService`), and the seeded filler
text every framework bench writes. Imports no framework but ADK (inside the function), so
the Redis bench runs without the `[bench]` extra's LangGraph savers."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

__all__ = ["adk_session_bench", "text"]


def text(rng: random.Random, n: int) -> str:
    """About `n` characters of words drawn by `rng` (seeded: the same for every backend)."""
    words = ["agent", "graph", "tool", "state", "commit", "test", "fix", "plan", "log", "run"]
    out: list[str] = []
    size = 0  # sum(len(w) + 1 for w in out), kept as it grows: a sum a word was quadratic
    while size < n:
        out.append(rng.choice(words))
        size += len(out[-1]) + 1
    return " ".join(out)[:n]


async def adk_session_bench(
    make: Callable[[], Any], events: int, close: Callable[[Any], Any]
) -> dict[str, float]:
    """The ADK workload on the services `make()` returns (a new one for the cold reads),
    each released with `await close(service)`: shared with `bench.redis`."""
    from google.adk.events.event import Event
    from google.adk.events.event_actions import EventActions
    from google.adk.sessions.base_session_service import GetSessionConfig
    from google.genai import types

    rng = random.Random(17)
    service = make()
    t = time.perf_counter()
    s = await service.create_session(app_name="bench", user_id="u", session_id="s")
    out = {"create_session ms": (time.perf_counter() - t) * 1e3}
    said = [
        types.Content(role="user", parts=[types.Part(text=text(rng, 300))]) for _ in range(events)
    ]
    t = time.perf_counter()
    for i, content in enumerate(said):
        delta = EventActions(state_delta={"turn": i})
        await service.append_event(s, Event(author="user", content=content, actions=delta))
    out["append_event/s"] = events / (time.perf_counter() - t)
    await close(service)
    service = make()
    recent = GetSessionConfig(num_recent_events=20)
    for name, config in (("cold", recent), ("warm", recent), ("whole session", None)):
        t = time.perf_counter()
        got = await service.get_session(
            app_name="bench", user_id="u", session_id="s", config=config
        )
        out[f"get_session {name} ms" if config is None else f"get_session(20) {name} ms"] = (
            time.perf_counter() - t
        ) * 1e3
        assert got is not None and len(got.events) == (events if config is None else 20)
    await close(service)
    return out
