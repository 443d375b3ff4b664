"""Transcript paging: the newest 20 messages of a 10,000-turn session with tool calls.

    .venv/bin/python -m bench.paging [--turns 10000] [--last 20] [--repeat 200]
    .venv/bin/python -m bench.paging --engine redis --url redis://127.0.0.1:6379/0

Builds one session of TURNS turns, each four messages as a coding harness writes them (a
user request, an assistant message with text and a tool call, the tool's result, an
assistant answer; ~2 kB per turn), then measures `load_transcript_messages(sid,
last=N)`:

- warm: on a store that has folded the transcript before (the cached state is sliced);
- cold: on a fresh `SessionStore` each time (no in-process cache; the OS page cache is
  warm, as for any process opening a store another one writes), read from the end of
  the live log, and after compaction from the end of the snapshot's transcript;

beside a full `load_transcript_messages(sid)` cold, the O(transcript) way. Medians of
REPEAT runs (cold: REPEAT // 4), in one process; times vary ~20% between runs on a
shared machine, the ratios hold. `--engine postgres|redis --url URL`: the same on that
engine, in a fresh schema or key prefix (`bench.places`).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

from bench import server_url
from bench.places import ENGINES, place
from eventstore import (
    Message,
    Role,
    SessionStore,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
)

SID = "paging"


def turn(i: int) -> list[Message]:
    """One turn of a coding harness: request, tool call, result, answer."""
    request = f"Turn {i}: make test_{i} pass; the failure is in src/module_{i % 37}.py. " * 3
    return [
        Message(Role.USER, request),
        Message(
            Role.ASSISTANT,
            f"Running test_{i} to see the failure.",
            blocks=[
                TextBlock(text=f"Running test_{i} to see the failure."),
                ToolUseBlock(
                    id=f"toolu_{i:06d}",
                    name="Bash",
                    input={"command": f"pytest -q tests/test_{i % 37}.py -k test_{i}"},
                ),
            ],
            metadata={"model": "claude-x", "usage": {"input_tokens": 1200 + i, "output": 80}},
        ),
        Message(
            Role.TOOL,
            "",
            name="Bash",
            blocks=[
                ToolResultBlock(
                    tool_use_id=f"toolu_{i:06d}",
                    content=f"F\n=== FAILURES ===\ntest_{i}: assert {i} == {i + 1}\n" * 6,
                    is_error=i % 5 == 0,
                )
            ],
        ),
        Message(Role.ASSISTANT, f"Fixed the off-by-one in module_{i % 37}; test_{i} passes. " * 2),
    ]


def median_ms(fn: Callable[[], object], repeat: int) -> float:
    """The median wall time of `fn` in milliseconds."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def measure(root: str, last: int, repeat: int) -> dict[str, float]:
    """Warm and cold paging, and a full cold load, of the session at `root`."""
    out: dict[str, float] = {}
    with SessionStore(root) as warm:
        want = warm.load_transcript_messages(SID)[-last:]
        assert warm.load_transcript_messages(SID, last=last) == want
        out["warm page"] = median_ms(lambda: warm.load_transcript_messages(SID, last=last), repeat)

    def cold_page() -> None:
        with SessionStore(root) as s:
            assert len(s.load_transcript_messages(SID, last=last)) == last

    def cold_full() -> None:
        with SessionStore(root) as s:
            s.load_transcript_messages(SID)

    with SessionStore(root) as check:
        assert check.load_transcript_messages(SID, last=last) == want
    out["cold page"] = median_ms(cold_page, max(5, repeat // 4))
    out["cold full load"] = median_ms(cold_full, max(3, repeat // 40))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=10_000)
    parser.add_argument("--last", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--engine", choices=ENGINES, default="file")
    parser.add_argument("--url", help="the PostgreSQL database or Redis server (--engine)")
    args = parser.parse_args()
    url = None if args.engine == "file" else server_url(parser, args.url, args.engine.upper())
    with place(args.engine, url) as p:
        root = p.store
        with SessionStore(root) as store:
            for i in range(args.turns):
                store.append_transcript_messages(SID, turn(i))
        log = p.dir / "sessions" / SID / "log.jsonl"
        size = f", log {log.stat().st_size / 1e6:.1f} MB" if args.engine == "file" else ""
        print(
            f"{args.turns:,} turns, {4 * args.turns:,} messages on {args.engine}{size};"
            f" last={args.last}; medians in ms"
        )
        live = measure(root, args.last, args.repeat)
        with SessionStore(root) as store:
            store.compact(SID)
            for i in range(args.turns, args.turns + 2):  # a short live tail after the snapshot
                store.append_transcript_messages(SID, turn(i))
        compacted = measure(root, args.last, args.repeat)
        print(f"{'':16}{'live log':>12}{'compacted':>12}")
        for key in live:
            print(f"{key:16}{live[key]:12.3f}{compacted[key]:12.3f}")
        ratio = live["cold full load"] / live["cold page"]
        print(f"cold page vs cold full load (live log): {ratio:.0f}x less time")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
