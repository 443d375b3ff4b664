"""Encryption at rest against plain: appends and cold loads of the reference workload.

    python -m bench.encryption [--turns 2000] [--runs 7] [--in-process]

Each run is a fresh interpreter per mode, the modes interleaved (drift on a shared
machine hits them alike): `plain` (the default store: fold caches on), `plain-nocache`
(caches=False: what a cold load costs with no fold cache to read) and
`encrypted` (`keys=KeyRing(...)`). A run writes the whole workload of `--turns` turns into a
new store (flush durability; microseconds per operation), closes it, then opens the
store again and times the first bootstrap load and the first transcript load (ms).
Prints the median and spread (min..max) of each and each mode's ratio to `plain`.
`--in-process`: appends only, `plain` and `encrypted` stores alternating in this process
(no interpreter start-up or import in the figure).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

_RUN = """
import os, sys, tempfile, time
sys.path.insert(0, {src!r})
from eventstore import KeyRing, SessionStore
from bench.workload import Workload, apply_op
mode = {mode!r}
kw = {{}}
if mode == "encrypted":
    kw["keys"] = KeyRing({{"bench": bytes(32)}})
if mode == "plain-nocache":
    kw["caches"] = False
ops = Workload({turns}).ops
with tempfile.TemporaryDirectory() as root:
    with SessionStore(root, **kw) as s:
        t = time.perf_counter()
        for op in ops:
            apply_op(s, "bench-session", op)
        append = (time.perf_counter() - t) / len(ops) * 1e6
    with SessionStore(root, **kw) as s:
        t = time.perf_counter()
        s.load_bootstrap_state("bench-session")
        boot = (time.perf_counter() - t) * 1e3
    with SessionStore(root, **kw) as s:
        t = time.perf_counter()
        s.load_transcript_messages("bench-session")
        tr = (time.perf_counter() - t) * 1e3
    print(append, boot, tr)
"""

MODES = ("plain", "plain-nocache", "encrypted")
FIGURES = ("append us/op", "cold bootstrap ms", "cold transcript ms")


def _run(src: Path, mode: str, turns: int) -> list[float]:
    code = _RUN.format(src=str(src), mode=mode, turns=turns)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return [float(x) for x in out.stdout.split()]


def _in_process(turns: int, runs: int) -> None:
    import tempfile
    import time

    from eventstore import KeyRing, SessionStore

    from .workload import Workload, apply_op

    ops = Workload(turns).ops
    got: dict[str, list[float]] = {"plain": [], "encrypted": []}
    for _ in range(runs):
        for mode in got:
            kw: dict[str, object] = (
                {"keys": KeyRing({"bench": bytes(32)})} if mode == "encrypted" else {}
            )
            with tempfile.TemporaryDirectory() as root, SessionStore(root, **kw) as s:  # type: ignore[arg-type]
                t = time.perf_counter()
                for op in ops:
                    apply_op(s, "bench-session", op)
                got[mode].append((time.perf_counter() - t) / len(ops) * 1e6)
    med = {m: statistics.median(v) for m, v in got.items()}
    print(f"{turns} turns, {runs} runs per mode in one process: append us/op")
    for m, v in got.items():
        print(
            f"  {m:7s} {med[m]:9.2f}  {min(v):9.2f}..{max(v):9.2f}  {med[m] / med['plain']:5.2f}x"
        )


def main(argv: list[str] | None = None) -> int:
    """Run the interleaved rounds and print the table."""
    ap = argparse.ArgumentParser(prog="python -m bench.encryption", description=__doc__)
    ap.add_argument("--turns", type=int, default=2000)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--in-process", action="store_true")
    a = ap.parse_args(argv)
    if a.in_process:
        _in_process(a.turns, a.runs)
        return 0
    src = Path(__file__).resolve().parents[1]
    got: dict[str, list[list[float]]] = {m: [] for m in MODES}
    for _ in range(a.runs):
        for mode in MODES:
            got[mode].append(_run(src, mode, a.turns))
    med = {m: [statistics.median(r[i] for r in got[m]) for i in range(3)] for m in MODES}
    print(f"{a.turns} turns, {a.runs} runs per mode (median, min..max, ratio to plain)")
    for i, name in enumerate(FIGURES):
        print(f"\n{name}")
        for m in MODES:
            vals = [r[i] for r in got[m]]
            ratio = med[m][i] / med["plain"][i]
            print(f"  {m:14s} {med[m][i]:9.2f}  {min(vals):9.2f}..{max(vals):9.2f}  {ratio:5.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
