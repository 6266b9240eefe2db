"""`python -m mqk` is the same program as `mqk`."""

from mqk.cli import main

raise SystemExit(main())
