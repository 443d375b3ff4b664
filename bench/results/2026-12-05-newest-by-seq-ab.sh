#!/bin/bash
# A/B: base (/tmp/s51/base) vs new (/work/main), Agents SDK on an engine, alternating
export EVENTSTORE_TEST_REDIS_URL=redis://127.0.0.1:56379/0 EVENTSTORE_TEST_POSTGRES_URL=postgresql://postgres@127.0.0.1:55499/postgres
eng=$1; turns=$2; reps=$3
for r in $(seq $reps); do
  for v in base new; do
    d=/tmp/s51/base; [ $v = new ] && d=/work/main
    (cd $d && PYTHONPATH=$d /work/main/.venv/bin/python -m bench.integrations --engine $eng --only ${ONLY:-agents} --turns $turns --repeat 1 --json /tmp/s51/ab-$eng-$v-$r.json >/dev/null 2>&1)
  done
done
/work/main/.venv/bin/python - "$eng" "$reps" <<'PY'
import json, sys, statistics
eng, reps = sys.argv[1], int(sys.argv[2])
for v in ("base", "new"):
    rows = {}
    for r in range(1, reps + 1):
        d = json.load(open(f"/tmp/s51/ab-{eng}-{v}-{r}.json"))
        (title, runs), = d.items()
        for backend, rs in runs.items():
            for k, x in rs[0].items():
                rows.setdefault((backend, k), []).append(x)
    for (b, k), xs in rows.items():
        if True:
            print(f"{v:5s} {b:14s} {k:26s} median {statistics.median(xs):8.2f}  [{min(xs):.2f}-{max(xs):.2f}]")
PY
