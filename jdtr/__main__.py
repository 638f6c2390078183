"""`python -m jdtr`: see `jdtr.cli`."""

from .cli import main

raise SystemExit(main())
