import json, statistics, sys
HIGHER = {"turns/s", "puts/s", "add_items/s", "append_event/s", "append/s"}
WANT = {
 "langgraph": ["puts/s", "cold get ms", "cold get of an older checkpoint ms", "list all ms", "turns/s"],
 "agents": ["add_items/s", "cold get_items(20) ms", "cold pop_item ms", "warm get_items ms", "warm pop_item ms"],
 "adk": ["create_session ms", "append_event/s", "get_session(20) cold ms", "get_session(20) warm ms"],
}
pre = sys.argv[1]
rows = []
for eng in ("file", "postgres", "redis"):
    d = json.load(open(f"{pre}-{eng}.json"))
    for title, runs in d.items():
        fw = "langgraph" if title.startswith("LangGraph") else "agents" if title.startswith("Agents") else "adk" if title.startswith("ADK") else None
        if fw is None: continue
        backends = list(runs)
        theirs = backends[0]
        ours = "eventstore-flush" if "eventstore-flush" in runs else "eventstore"
        for metric in WANT[fw]:
            if metric not in runs[ours][0]: continue
            a = [r[metric] for r in runs[theirs]]; b = [r[metric] for r in runs[ours]]
            ma, mb = statistics.median(a), statistics.median(b)
            # paired ratios per repeat
            pr = sorted((y / x if metric in HIGHER else x / y) for x, y in zip(a, b))
            ratio = mb / ma if metric in HIGHER else ma / mb
            rows.append(f"| {eng} | {title.split(',')[0]} | {metric} | {theirs} {ma:,.2f} | {mb:,.2f} | {ratio:.2f} ({pr[0]:.2f}-{pr[-1]:.2f}) |")
print("| engine | framework | metric | their backend | eventstore | × (paired range) |")
print("|---|---|---|---:|---:|---:|")
print("\n".join(rows))
