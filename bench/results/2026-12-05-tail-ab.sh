#!/bin/bash
# A/B: base (/tmp/wt-base52 = e799a67) vs new (/work/main), one framework on an engine, alternating
export EVENTSTORE_TEST_REDIS_URL=redis://127.0.0.1:56379/0 EVENTSTORE_TEST_POSTGRES_URL=postgresql://postgres@127.0.0.1:55499/postgres
eng=$1; only=$2; reps=$3; url=$4
OUT=${OUT:-/tmp/ab}; mkdir -p "$OUT"
for r in $(seq $reps); do
  for v in base new; do
    d=/tmp/wt-base52; [ $v = new ] && d=/work/main
    (cd $d && PYTHONPATH=$d /work/main/.venv/bin/python -m bench.integrations --engine $eng ${url:+--url $url} --only $only --repeat 1 --json $OUT/$eng-$only-$v-$r.json >/dev/null 2>$OUT/$eng-$only-$v-$r.err)
  done
done
/work/main/.venv/bin/python - "$eng" "$only" "$reps" "$OUT" <<'PY'
import json, sys, statistics
eng, only, reps, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
rows = {}
for v in ("base", "new"):
    for r in range(1, reps + 1):
        d = json.load(open(f"{out}/{eng}-{only}-{v}-{r}.json"))
        for title, runs in d.items():
            for backend, rs in runs.items():
                for k, x in rs[0].items():
                    rows.setdefault((backend, k), {}).setdefault(v, []).append(x)
for (b, k), vs in rows.items():
    line = f"{eng} {b:14s} {k:30s}"
    for v in ("base", "new"):
        xs = vs.get(v, [])
        if xs:
            line += f" {v} {statistics.median(xs):9.2f} [{min(xs):.2f}-{max(xs):.2f}]"
    print(line)
PY
