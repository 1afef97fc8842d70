"""The ``crossaudit`` command line (``python -m crossaudit.cli`` or the ``crossaudit`` script)."""

from crossaudit.cli.main import main

__all__ = ["main"]
