"""`python -m bench`: see `bench.run` (`--engine postgres`: see `bench.postgres`;
`--engine redis`: see `bench.redis`)."""

from __future__ import annotations

import sys

if any(a == "--engine" or a.startswith("--engine=") for a in sys.argv[1:]):
    if "redis" in sys.argv[1:] or "--engine=redis" in sys.argv[1:]:
        from .redis import main as engine_main
    else:
        from .postgres import main as engine_main

    sys.exit(engine_main(sys.argv[1:]))

from .run import main

sys.exit(main())
