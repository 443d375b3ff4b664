"""A/B of a fresh process's first append to an existing session on files, and its
close: base checkout against new, alternating processes.

    python bench/results/2026-12-05-first-append-ab.py BASE_CHECKOUT NEW_CHECKOUT [REPS]

Each child imports eventstore and opens the store (not timed), appends one progress
entry to a session made before (timed), then closes the store (timed); ms.
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile

CHILD = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
from eventstore import SessionStore
from eventstore.records import ProgressEntry
store = SessionStore(sys.argv[2])
entry = ProgressEntry(run_id="r", summary="one more step")
t0 = time.perf_counter(); c0 = time.process_time()
store.append_progress_entry("s", entry)
t1 = time.perf_counter(); c1 = time.process_time()
store.close()
t2 = time.perf_counter(); c2 = time.process_time()
print(json.dumps({"append wall": (t1 - t0) * 1e3, "append cpu": (c1 - c0) * 1e3,
                  "close wall": (t2 - t1) * 1e3, "close cpu": (c2 - c1) * 1e3}))
"""


def main() -> None:
    base, new = sys.argv[1], sys.argv[2]
    reps = int(sys.argv[3]) if len(sys.argv) > 3 else 21
    runs: dict[str, dict[str, list[float]]] = {"base": {}, "new": {}}
    with tempfile.TemporaryDirectory() as tmp:
        roots = {}
        for name, src in (("base", base), ("new", new)):
            roots[name] = os.path.join(tmp, name)
            subprocess.run(
                [sys.executable, "-c", CHILD, src, roots[name]], check=True, capture_output=True
            )  # the session, made first
        for _ in range(reps):
            for name, src in (("base", base), ("new", new)):
                out = subprocess.run(
                    [sys.executable, "-c", CHILD, src, roots[name]],
                    check=True,
                    capture_output=True,
                    text=True,
                ).stdout
                for k, v in json.loads(out).items():
                    runs[name].setdefault(k, []).append(v)
    print("| figure | base ms (min-max) | new ms (min-max) |")
    print("|---|---:|---:|")
    for k in runs["base"]:
        cells = []
        for name in ("base", "new"):
            xs = runs[name][k]
            cells.append(f"{statistics.median(xs):.2f} ({min(xs):.2f}-{max(xs):.2f})")
        print(f"| {k} | {cells[0]} | {cells[1]} |")


if __name__ == "__main__":
    main()
