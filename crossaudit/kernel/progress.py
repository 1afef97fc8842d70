"""The progress callback of a long preparation (an image build, an evaluator upload, a policy
deploy): one type for the sandboxes that report it, the service and SDK that pass it on and the
CLI that draws it."""

from __future__ import annotations

from collections.abc import Callable

ProgressCallback = Callable[[str, float], None]  # (message, fraction of the whole job in 0..1)
