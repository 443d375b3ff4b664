"""`python -m bench`: see `bench.run` (`--engine postgres`: see `bench.postgres`)."""

from __future__ import annotations

import sys

if any(a == "--engine" or a.startswith("--engine=") for a in sys.argv[1:]):
    from .postgres import main as engine_main

    sys.exit(engine_main(sys.argv[1:]))

from .run import main

sys.exit(main())
