#!/bin/bash
# A/B of cold LangGraph reads on PostgreSQL: base (a `git archive` of the base commit in
# $BASE) against new (this worktree, $NEW), alternating processes, each running
# bench/langgraph_pg_cold.py (of $NEW) on its own code: `ROUNDS` processes each, `READS`
# cold reads of each kind per process.
export EVENTSTORE_TEST_POSTGRES_URL=${EVENTSTORE_TEST_POSTGRES_URL:-postgresql://postgres@127.0.0.1:55499/postgres}
BASE=${BASE:-/tmp/pgo/base}; NEW=${NEW:-/tmp/wt-pg-older}
ROUNDS=${1:-6}; READS=${2:-10}; OUT=${OUT:-/tmp/pgo/ab}; mkdir -p "$OUT"
for r in $(seq "$ROUNDS"); do
  for v in base new; do
    d=$BASE; [ $v = new ] && d=$NEW
    for try in 1 2 3; do  # (a shared server: other tests end connections now and then)
      (cd "$d" && PYTHONPATH=$d /work/main/.venv/bin/python "$NEW/bench/langgraph_pg_cold.py" \
        --reads "$READS" --json "$OUT/$v-$r.json" >/dev/null 2>"$OUT/$v-$r.err") && break
    done
  done
done
/work/main/.venv/bin/python - "$ROUNDS" "$OUT" <<'PY'
import json, statistics, sys
rounds, out = int(sys.argv[1]), sys.argv[2]
rows = {}
for v in ("base", "new"):
    for r in range(1, rounds + 1):
        for backend, reads in json.load(open(f"{out}/{v}-{r}.json")).items():
            for name, xs in reads.items():
                rows.setdefault((name, backend), {}).setdefault(v, []).extend(xs)
print("| read | backend | base: median (q1-q3) | new: median (q1-q3) | n |")
print("|---|---|---:|---:|---:|")
for (name, backend), vs in sorted(rows.items()):
    cells = []
    for v in ("base", "new"):
        xs = vs[v]
        q1, _, q3 = statistics.quantiles(xs, n=4)
        cells.append(f"{statistics.median(xs):.2f} ({q1:.2f}-{q3:.2f})")
    print(f"| {name} | {backend} | {cells[0]} | {cells[1]} | {len(vs['new'])} |")
PY
