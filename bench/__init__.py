"""Side-by-side benchmarks of eventstore against what harnesses would use instead.

`python -m bench` runs every backend on a deterministic harness workload and prints one
markdown table; `python -m bench --check` proves every backend gives the same answers.
See bench/README.md.
"""
