"""The summary table of 2026-12-05-integrations-every-engine.md, from the JSON each
`python -m bench.integrations --engine E --json PREFIX-E.json` wrote:
`python 2026-12-05-integrations-every-engine-table.py PREFIX`."""

import json
import statistics
import sys
from pathlib import Path

HIGHER = {"turns/s", "puts/s", "add_items/s", "append_event/s", "append/s"}
WANT = {
    "LangGraph": ["puts/s", "cold get ms", "cold get of an older checkpoint ms", "list all ms"],
    "Agents": ["add_items/s", "cold get_items(20) ms", "cold pop_item ms", "warm get_items ms"],
    "ADK": ["create_session ms", "append_event/s", "get_session(20) cold ms"],
}
WANT["LangGraph"] += ["turns/s"]
WANT["Agents"] += ["warm pop_item ms"]
WANT["ADK"] += ["get_session(20) warm ms"]


def rows(engine: str, runs_by_title: dict[str, dict[str, list[dict[str, float]]]]) -> list[str]:
    """The table's rows of one engine's runs."""
    out = []
    for title, runs in runs_by_title.items():
        framework = next((f for f in WANT if title.startswith(f)), None)
        if framework is None:
            continue
        theirs = next(iter(runs))
        ours = "eventstore-flush" if "eventstore-flush" in runs else "eventstore"
        for metric in WANT[framework]:
            if metric not in runs[ours][0]:
                continue
            a = [r[metric] for r in runs[theirs]]
            b = [r[metric] for r in runs[ours]]
            ma, mb = statistics.median(a), statistics.median(b)
            up = metric in HIGHER
            paired = sorted((y / x if up else x / y) for x, y in zip(a, b, strict=True))
            ratio = mb / ma if up else ma / mb
            out.append(
                f"| {engine} | {title.split(',')[0]} | {metric} | {theirs} {ma:,.2f}"
                f" | {mb:,.2f} | {ratio:.2f} ({paired[0]:.2f}-{paired[-1]:.2f}) |"
            )
    return out


def main() -> None:
    """Print the table."""
    prefix = sys.argv[1]
    print("| engine | framework | metric | their backend | eventstore | × (paired range) |")
    print("|---|---|---|---:|---:|---:|")
    for engine in ("file", "postgres", "redis"):
        print("\n".join(rows(engine, json.loads(Path(f"{prefix}-{engine}.json").read_text()))))


if __name__ == "__main__":
    main()
