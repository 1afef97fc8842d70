"""Runs the agent: ``python -m sandbox.agent``, or through :mod:`.launch` (both backends)."""

from .supervisor import main

raise SystemExit(main())
