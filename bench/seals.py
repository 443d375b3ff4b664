"""What signed heads cost: verify with seals against without, writing with a sealing
store, and cold loads with keyed (HMAC) caches against CRC-32 ones.

    python -m bench.seals [--turns 2000] [--every 100] [--repeat 9]

Writes the reference workload (`bench/workload.py`, `--turns` turns) into two file
stores, one plain and one opened with an Ed25519 signing key sealing every `--every`
lines (and writing a witness file), then times, each case's runs interleaved with the
others so drift of the shared machine spreads over all of them:

- `verify plain`: `verify(sid)` of the plain store (the baseline);
- `verify sealed, no key`: `verify(sid)` of the sealed store (its seal lines are more lines);
- `verify sealed + public key`: `verify(sid, public_key=...)` (every signature checked);
- `verify sealed + key + witness`: the same, and the witness file's seals;
- `cold transcript load plain` / `keyed`: a new store instance's
  `load_transcript_messages` (from the fold cache saved at close: CRC-32 vs HMAC-SHA256);
- `write plain` / `write sealed, no witness` / `write sealed`: the whole workload written
  into a new store (the witness file is fsynced at each seal).

Prints medians and spreads (min..max) in ms and each case's ratio to its baseline's median.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from bench.workload import Workload, apply_op
from eventstore import SealPolicy, SessionStore

SID = "bench-session"


def _write(root: Path, turns: int, **options: object) -> None:
    with SessionStore(root, **options) as store:  # type: ignore[arg-type]
        for op in Workload(turns).ops:
            apply_op(store, SID, op)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=2000)
    parser.add_argument("--every", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=9)
    args = parser.parse_args()
    key = Ed25519PrivateKey.generate()
    public = key.public_key()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        plain, sealed, witness = base / "plain", base / "sealed", base / "witness.jsonl"
        policy = SealPolicy(every=args.every, witness=witness)
        _write(plain, args.turns)
        _write(sealed, args.turns, signing_key=key, seal_policy=policy)
        with SessionStore(sealed) as s:
            seals = sum(1 for e in s.read_events(SID) if type(e).__name__ == "Sealed")
            lines = s.last_seq(SID)
            assert s.verify(SID, public_key=public, witness=witness).ok

        def verify(root: Path, **kw: object) -> Callable[[], object]:
            def run() -> object:
                with SessionStore(root) as s:
                    return s.verify(SID, **kw)  # type: ignore[arg-type]

            return run

        def cold(root: Path, **kw: object) -> Callable[[], object]:
            def run() -> object:
                with SessionStore(root, **kw) as s:  # type: ignore[arg-type]
                    return s.load_transcript_messages(SID)

            return run

        counter = iter(range(10**6))

        def write(sealing: bool, witnessed: bool = False) -> Callable[[], object]:
            def run() -> object:
                n = next(counter)
                if not sealing:
                    _write(base / f"w{n}", args.turns)
                    return None
                w = base / f"w{n}.jsonl" if witnessed else None  # (the verified one stays)
                seal = SealPolicy(every=args.every, witness=w)
                _write(base / f"w{n}", args.turns, signing_key=key, seal_policy=seal)
                return None

            return run

        cold(sealed, signing_key=key)()  # a keyed cache: the first keyed close writes it
        cases: dict[str, Callable[[], object]] = {
            "verify plain": verify(plain),
            "verify sealed, no key": verify(sealed),
            "verify sealed + public key": verify(sealed, public_key=public),
            "verify sealed + key + witness": verify(sealed, public_key=public, witness=witness),
            "cold transcript load plain": cold(plain),
            "cold transcript load keyed": cold(sealed, signing_key=key),
            "write plain": write(False),
            "write sealed, no witness": write(True),
            "write sealed": write(True, witnessed=True),
        }
        times: dict[str, list[float]] = {name: [] for name in cases}
        for _ in range(args.repeat):
            for name, fn in cases.items():
                t0 = time.perf_counter()
                fn()
                times[name].append((time.perf_counter() - t0) * 1000)
    baselines = {
        "verify": "verify plain",
        "cold": "cold transcript load plain",
        "write": "write plain",
    }
    print(f"{args.turns} turns, {lines} lines of which {seals} seals; {args.repeat} runs each")
    print(f"{'case':<32} {'median ms':>10} {'min..max ms':>18} {'x baseline':>11}")
    for name, ts in times.items():
        med = statistics.median(ts)
        base_med = statistics.median(times[baselines[name.split()[0]]])
        spread = f"{min(ts):.1f}..{max(ts):.1f}"
        print(f"{name:<32} {med:>10.1f} {spread:>18} {med / base_med:>11.2f}")


if __name__ == "__main__":
    main()
