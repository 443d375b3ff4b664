"""What checking the hash chain on every load costs.

    python -m bench.hashcheck [--sizes 500,2000,10000] [--repeat 15]

Writes the reference workload (`bench/workload.py`) into a file store, then times, on the
session's log bytes (already in memory, so only the CPU work is measured):

- `decode`: the bare msgspec decode of every line with the bootstrap decoder (the
  ceiling: what a load would cost with no checks at all);
- `read_lines`: the line reader of every load (`eventstore.format.reader.read_lines`): the same
  decode plus sequence, batch and hash-chain checks;
- `hash only`: the hash-chain loop alone (one BLAKE2b per line);

and the cold `load_bootstrap_state` of a new store instance (read + checks + fold).
Medians of `--repeat` runs; the machine is shared, so compare ratios within one run.
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench.workload import Workload, apply_op
from eventstore import SessionStore
from eventstore.engines.file.layout import SessionPaths
from eventstore.format.reader import read_lines
from projections import BootstrapProjection

SID = "bench-session"


def _median_ms(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000


def _hash_loop(lines: list[bytes]) -> None:
    blake = hashlib.blake2b
    prev = b""
    for line in lines:
        blake(prev + line[:-24] + b"}", digest_size=8).hexdigest()
        prev = line[-18:-2]


def measure(turns: int, repeat: int) -> dict[str, float]:
    """The medians (ms) at one size."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "store"
        with SessionStore(root) as store:
            for op in Workload(turns).ops:
                apply_op(store, SID, op)
        data = SessionPaths(root, SID).log.read_bytes()
        with SessionStore(root) as store:
            codec = store.codec
            decoder = codec.decoder(BootstrapProjection.event_types)
            lines = data.split(b"\n")[:-1]
            out = {
                "lines": float(len(lines)),
                "MB": len(data) / 1e6,
                "decode": _median_ms(lambda: decoder.decode_lines(data), repeat),
                "read_lines": _median_ms(lambda: read_lines(data, codec, decoder, "bench"), repeat),
                "hash only": _median_ms(lambda: _hash_loop(lines), repeat),
            }

        def cold() -> None:
            with SessionStore(root) as s:
                s.load_bootstrap_state(SID)

        out["cold load"] = _median_ms(cold, repeat)
    return out


def main(argv: list[str] | None = None) -> int:
    """Print a markdown table of the medians at each size."""
    ap = argparse.ArgumentParser(prog="python -m bench.hashcheck", description=__doc__)
    ap.add_argument("--sizes", default="500,2000,10000")
    ap.add_argument("--repeat", type=int, default=15)
    args = ap.parse_args(argv)
    print(
        "| turns | lines | MB | decode ms | read_lines ms | hash only ms"
        " | checks / decode | cold load ms |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for size in (int(s) for s in args.sizes.split(",")):
        m = measure(size, args.repeat)
        print(
            f"| {size:,} | {m['lines']:,.0f} | {m['MB']:.1f} | {m['decode']:.2f} |"
            f" {m['read_lines']:.2f} | {m['hash only']:.2f} |"
            f" {m['read_lines'] / m['decode']:.2f}x | {m['cold load']:.2f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
