"""`python -m bench`: run every backend side by side and print markdown tables of medians.

Each (backend, size, repeat) runs in its own process with a timeout; a backend whose
time at the next size, extrapolated from the smaller sizes, would pass the timeout is
skipped and reported as such. Ratios (`×`) say how many times better eventstore is than
the row's backend at the same durability (above 1: eventstore wins), whatever the
direction of the metric.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from typing import Any

from .backends import BACKENDS, available
from .check import run_check

__all__ = ["main"]

DEFAULT_SIZES = [500, 2000, 10_000]
QUICK_SIZES = [200, 1000]
WARM_K = [10, 100, 1000]
#: the compaction row with `Retention`: keep the newest 500 progress entries, 100 checkpoints
RETENTION = {"progress": 500, "checkpoints": 100}


def _worker(mode: str, args: dict[str, Any], timeout: float) -> dict[str, Any] | str:
    """Run one worker; its JSON result, or a string saying why there is none."""
    cmd = [sys.executable, "-m", "bench.worker", mode, json.dumps(args)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"stopped after {timeout:.0f} s"
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-1:] or ["?"]
        return f"failed: {tail[0]}"
    return json.loads(proc.stdout)  # type: ignore[no-any-return]


def _repeats(backend: str, size: int, base: int) -> int:
    if backend == "rewrite-json" and size >= 2000:
        return 1
    if size > 2000:
        return min(base, 3)
    return base


def _predict(times: dict[int, float], size: int) -> float | None:
    """Extrapolate write time to `size` from the two largest measured sizes (power law)."""
    pts = sorted(times.items())
    if not pts:
        return None
    if len(pts) == 1:
        (n, t), p = pts[0], 2.0
    else:
        (n0, t0), (n, t) = pts[-2], pts[-1]
        p = max(1.0, math.log(max(t, 1e-9) / max(t0, 1e-9)) / math.log(n / n0))
    return t * (size / n) ** p


def _med(rows: list[dict[str, Any]], key: str, sub: str | None = None) -> float:
    vals = [r[key][sub] if sub else r[key] for r in rows]
    return statistics.median(vals)


def _fmt_rate(v: float) -> str:
    return f"{v:,.0f}"


def _fmt_ms(v: float) -> str:
    ms = v * 1000
    return f"{ms:,.2f}" if ms < 10 else f"{ms:,.1f}" if ms < 100 else f"{ms:,.0f}"


def _fmt_mb(v: float) -> str:
    return f"{v:,.1f}"


def _ratio(r: float) -> str:
    return f"{r:,.1f}×" if r < 100 else f"{r:,.0f}×"


def _machine() -> str:
    return (
        f"{os.cpu_count()} CPUs ({platform.processor() or platform.machine()}), "
        f"Python {platform.python_version()}, {platform.platform()}; "
        f"{_dt.datetime.now(_dt.UTC):%Y-%m-%d %H:%M} UTC"
    )


def main_table(
    results: dict[tuple[str, int], list[dict[str, Any]] | str], sizes: list[int], names: list[str]
) -> str:
    """The one table of medians, with ratios to eventstore at the same durability."""
    head = (
        "| turns | backend | write ops/s | close ms | cold bootstrap load ms"
        " | warm load after 10 ms | cold transcript load ms | on disk MB | peak RSS MB |\n"
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|"
    )
    lines = [head]
    for size in sizes:
        for name in names:
            res = results.get((name, size))
            if res is None:
                continue
            if isinstance(res, str):
                lines.append(f"| {size:,} | {name} | {res} | | | | | | |")
                continue
            ref_name = "eventstore-" + BACKENDS[name].durability
            ref = results.get((ref_name, size))
            cells = _cells(res)
            if name != ref_name and isinstance(ref, list):
                rcells = _cells(ref)
                ratios = [rcells[0] / cells[0]] + [
                    c / r for c, r in zip(cells[1:], rcells[1:], strict=True)
                ]
                shown = [
                    f"{f(c)} ({_ratio(q)})" for f, c, q in zip(_FMTS, cells, ratios, strict=True)
                ]
            else:
                shown = [f(c) for f, c in zip(_FMTS, cells, strict=True)]
            lines.append(f"| {size:,} | {name} | " + " | ".join(shown) + " |")
    return "\n".join(lines)


_FMTS = [_fmt_rate, _fmt_ms, _fmt_ms, _fmt_ms, _fmt_ms, _fmt_mb, _fmt_mb]


def _cells(rows: list[dict[str, Any]]) -> list[float]:
    return [
        _med(rows, "write_ops_s"),
        _med(rows, "close_s"),
        _med(rows, "cold_bootstrap_s"),
        _med(rows, "warm", "10"),
        _med(rows, "cold_transcript_s"),
        _med(rows, "disk_bytes") / 1e6,
        _med(rows, "cold_rss_mb"),
    ]


def ceiling_table(results: dict[tuple[str, int], Any], sizes: list[int]) -> str:
    """Cold bootstrap load against bare decode_lines of the same bytes."""
    out = [
        "| turns | log MB | bare decode, full union ms | bare decode, bootstrap decoder ms"
        " | cold load_bootstrap_state ms | cold / full | cold / bootstrap decoder |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for size in sizes:
        rows = results.get(("eventstore-flush", size))
        if not isinstance(rows, list):
            continue
        full, stub = _med(rows, "bare_decode_s", "full"), _med(rows, "bare_decode_s", "stub")
        cold = _med(rows, "cold_bootstrap_s")
        out.append(
            f"| {size:,} | {_med(rows, 'log_bytes') / 1e6:,.1f} | {_fmt_ms(full)} | "
            f"{_fmt_ms(stub)} | {_fmt_ms(cold)} | {cold / full:.2f}× | {cold / stub:.2f}× |"
        )
    return "\n".join(out)


def warm_table(warm: dict[int, list[dict[str, Any]]]) -> str:
    """Warm load after k events appended by another store instance, per session size."""
    ks = ["0", *map(str, WARM_K)]
    out = [
        "| session turns | " + " | ".join(f"k = {k} ms" for k in ks) + " |",
        "|---:|" + "---:|" * len(ks),
    ]
    for size, rows in sorted(warm.items()):
        out.append(f"| {size:,} | " + " | ".join(_fmt_ms(_med(rows, "warm", k)) for k in ks) + " |")
    return "\n".join(out)


def transcript_scale_table(rows: dict[float, list[dict[str, Any]]], turns: int) -> str:
    """Cold bootstrap load as the transcript grows and the bootstrap events stay the same."""
    out = [
        f"| message size × ({turns:,} turns) | log MB | cold load_bootstrap_state ms"
        " | bare decode, bootstrap decoder ms |",
        "|---:|---:|---:|---:|",
    ]
    for scale, rs in sorted(rows.items()):
        out.append(
            f"| {scale:g} | {_med(rs, 'log_bytes') / 1e6:,.1f} | "
            f"{_fmt_ms(_med(rs, 'cold_bootstrap_s'))} | "
            f"{_fmt_ms(_med(rs, 'bare_decode_s', 'stub'))} |"
        )
    return "\n".join(out)


def compact_table(rows: list[dict[str, Any]]) -> str:
    """Cold loads of a long session before and after compaction."""
    out = [
        "| events | message size × | retention | log MB before → after"
        " | cold bootstrap before → after ms | cold transcript before → after ms | compact s |",
        "|---:|---:|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        keep = r.get("retention")
        kept = ", ".join(f"{k} {v}" for k, v in keep.items()) if keep else "none"
        out.append(
            f"| {r['events']:,} | {r['msg_scale']:g} | {kept} | "
            f"{r['log_bytes_before'] / 1e6:,.1f} → "
            f"{r['log_bytes_after'] / 1e6:,.1f} | {_fmt_ms(r['cold_bootstrap_before_s'])} → "
            f"{_fmt_ms(r['cold_bootstrap_after_s'])} | {_fmt_ms(r['cold_transcript_before_s'])} → "
            f"{_fmt_ms(r['cold_transcript_after_s'])} | {r['compact_s']:.2f} |"
        )
    return "\n".join(out)


#: (label, statement) timed in fresh interpreters for the import row; `{tmp}` is a new
#: directory. Interleaved, so every statement sees the same machine load.
IMPORTS = [
    ("import msgspec", "import msgspec"),
    ("import sqlite3", "import sqlite3"),
    ("import eventstore", "import eventstore"),
    (
        "import eventstore + open a store",
        "from eventstore import SessionStore; SessionStore({tmp!r}).close()",
    ),
    (
        "import sqlite3 + open a database",
        "import sqlite3; sqlite3.connect({tmp!r} + '/db.sqlite').close()",
    ),
]


def _import_once(stmt: str) -> float:
    code = f"import time\nt = time.perf_counter()\n{stmt}\nprint(time.perf_counter() - t)"
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    return float(proc.stdout)


def import_times(runs: int) -> dict[str, list[float]]:
    """Seconds of each `IMPORTS` statement in fresh interpreters (after interpreter start,
    so only what the statement imports counts), `runs` of each, interleaved."""
    import compileall
    import tempfile

    # as installed: pip compiles bytecode at install time, but an editable checkout run
    # with PYTHONDONTWRITEBYTECODE=1 would recompile every module in every interpreter
    # (msgspec, installed, never does): compile ours once, like an install
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for package in ("eventstore", "projections"):
        compileall.compile_dir(os.path.join(here, package), quiet=1)
    out: dict[str, list[float]] = {label: [] for label, _ in IMPORTS}
    for _ in range(runs):
        with tempfile.TemporaryDirectory(prefix="bench-import-") as tmp:
            for label, stmt in IMPORTS:
                out[label].append(_import_once(stmt.format(tmp=tmp)))
    return out


def import_table(times: dict[str, list[float]]) -> str:
    """Medians, each against `import msgspec` measured in the same run."""
    ref = statistics.median(times["import msgspec"])
    out = ["| statement (fresh interpreter) | median ms | / import msgspec |", "|---|---:|---:|"]
    for label, vals in times.items():
        med = statistics.median(vals)
        out.append(f"| `{label}` | {_fmt_ms(med)} | {med / ref:.2f}× |")
    return "\n".join(out)


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _measure(
    a: argparse.Namespace, names: list[str], sizes: list[int], base: int
) -> tuple[dict[tuple[str, int], list[dict[str, Any]] | str], dict[int, list[dict[str, Any]]]]:
    """Every backend at every size (a worker process per run, the repeats interleaved);
    a backend whose writes would outrun the timeout is skipped. Returns the results by
    (backend, size) and the eventstore-flush runs (for the warm-load table)."""
    results: dict[tuple[str, int], list[dict[str, Any]] | str] = {}
    write_times: dict[str, dict[int, float]] = {n: {} for n in names}
    warm: dict[int, list[dict[str, Any]]] = {}
    for size in sorted(sizes):
        active: list[str] = []
        for name in names:
            prev = results.get((name, max((s for s in sizes if s < size), default=-1)))
            if isinstance(prev, str):
                results[(name, size)] = f"skipped: {prev.split(':')[0]} at a smaller size"
                continue
            guess = _predict(write_times[name], size)
            if guess is not None and guess > a.timeout:
                results[(name, size)] = f"skipped: writes would take ~{guess:,.0f} s"
                _log(f"{name} {size}: {results[(name, size)]}")
                continue
            active.append(name)
        rows: dict[str, list[dict[str, Any]]] = {name: [] for name in active}
        # the repeats interleaved across backends: a shared machine's drift hits each alike
        for rep in range(max((_repeats(n, size, base) for n in active), default=0)):
            for name in active:
                if rep >= _repeats(name, size, base) or (name, size) in results:
                    continue  # done, or failed
                is_es = name == "eventstore-flush"
                args = {
                    "backend": name,
                    "turns": size,
                    "timeout": a.timeout,
                    "cold_runs": 3 if name.startswith("eventstore") else 1,
                    "warm_k": [0, *WARM_K] if is_es and not a.no_extras else [10],
                }
                t = time.perf_counter()
                res = _worker("write", args, a.timeout)
                _log(f"{name} {size}: {time.perf_counter() - t:.1f} s")
                if isinstance(res, str):
                    results[(name, size)] = res
                else:
                    rows[name].append(res)
        for name, got in rows.items():
            if got and (name, size) not in results:
                results[(name, size)] = got
                write_times[name][size] = _med(got, "write_s")
                if name == "eventstore-flush":
                    warm[size] = got

    return results, warm


def _extras(
    a: argparse.Namespace,
    results: dict[tuple[str, int], list[dict[str, Any]] | str],
    sizes: list[int],
    warm: dict[int, list[dict[str, Any]]],
    raw: dict[str, Any],
) -> list[str]:
    """The eventstore-only tables (the fold's ceiling, warm loads, transcript scale,
    compaction), their raw results added to `raw`."""
    sections: list[str] = []
    sections += [
        "Fold against its ceiling (eventstore, flush):",
        ceiling_table(results, sorted(sizes)),
    ]
    sections += [
        "Warm load_bootstrap_state after k events appended by another store instance:",
        warm_table(warm),
    ]
    scale_turns = 200 if a.quick else 2000
    scaled: dict[float, list[dict[str, Any]]] = {}
    for scale in (0.1, 1.0, 4.0):
        args = {
            "backend": "eventstore-flush",
            "turns": scale_turns,
            "msg_scale": scale,
            "cold_runs": 3,
            "warm_k": [10],
        }
        res = _worker("write", args, a.timeout)
        if isinstance(res, dict):
            scaled[scale] = [res]
    raw["transcript_scale"] = scaled
    sections += [
        "Cold bootstrap load as the transcript grows (same bootstrap events):",
        transcript_scale_table(scaled, scale_turns),
    ]
    events = 5000 if a.quick else a.compact_events
    comp = []
    for scale, keep in ((1.0, None), (0.1, None), (0.1, RETENTION)):
        args = {"events": events, "msg_scale": scale, "cold_runs": 3, "retention": keep}
        res = _worker("compact", args, max(a.timeout, 600))
        _log(f"compact {events} x{scale}: {res if isinstance(res, str) else 'done'}")
        if isinstance(res, dict):
            comp.append(res)
    raw["compact"] = comp
    sections += ["Cold loads before and after `store.compact(sid)`:", compact_table(comp)]
    return sections


def main(argv: list[str] | None = None) -> int:
    """Parse options, run the check, the backends and the extras; print the tables."""
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    ap.add_argument("--quick", action="store_true", help="small sizes, one repeat, short extras")
    ap.add_argument("--sizes", help="comma-separated turn counts (default 500,2000,10000)")
    ap.add_argument(
        "--repeat", type=int, default=5, help="repeats at sizes <= 2,000 (default 5; 3 above)"
    )
    ap.add_argument("--backends", help=f"comma-separated, from: {', '.join(BACKENDS)}")
    ap.add_argument("--check", action="store_true", help="correctness mode only")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per run (default 300)")
    ap.add_argument("--compact-events", type=int, default=100_000)
    ap.add_argument("--no-extras", action="store_true", help="only the main table")
    ap.add_argument("--json", help="also write every raw result to this file")
    ap.add_argument(
        "--import-runs", type=int, default=21, help="fresh interpreters per import row (21)"
    )
    a = ap.parse_args(argv)

    names = a.backends.split(",") if a.backends else list(BACKENDS)
    unknown = [n for n in names if n not in BACKENDS]
    if unknown:
        ap.error(f"unknown backends: {', '.join(unknown)}")
    missing = [n for n in names if not available(n)]
    names = [n for n in names if n not in missing]

    ok, problems, skipped = run_check(turns=40 if a.check else 20, backends=names)
    for n in skipped + missing:
        _log(f"{n}: not installed (needs {BACKENDS[n].needs}); skipped")
    if problems:
        print("CHECK FAILED:\n" + "\n".join(problems))
        return 1
    _log(f"check: {len(ok)} backends agree ({', '.join(ok)})")
    if a.check:
        print(f"check passed: {', '.join(ok)} return equal bootstrap state and transcript")
        return 0

    sizes = (
        [int(s) for s in a.sizes.split(",")]
        if a.sizes
        else (QUICK_SIZES if a.quick else DEFAULT_SIZES)
    )
    base = 1 if a.quick and a.repeat == 5 else a.repeat
    started = time.perf_counter()
    results, warm = _measure(a, names, sizes, base)
    sections = [f"Machine: {_machine()}", main_table(results, sorted(sizes), names)]
    raw: dict[str, Any] = {"main": {f"{k[0]}@{k[1]}": v for k, v in results.items()}}
    imports = import_times(5 if a.quick else a.import_runs)
    raw["imports"] = imports
    sections += ["Import time, medians of fresh interpreters:", import_table(imports)]
    if not a.no_extras and "eventstore-flush" in names:
        sections += _extras(a, results, sizes, warm, raw)
    sections.append(f"Total run time: {time.perf_counter() - started:,.0f} s.")
    print("\n\n".join(sections))
    if a.json:
        with open(a.json, "w", encoding="utf-8") as fh:
            json.dump(raw, fh, indent=1, default=str)
    return 0
