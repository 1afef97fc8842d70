"""Guardrails AI, installed from PyPI into its own virtual environment by the benchmark itself.

The environment lives in ``.venv-bench/guardrails-ai-<version>`` (created once, reused); the
validators equivalent to the benchmark policy's rules are in ``guardrails_runner.py``. The run
gets its own ``HOME`` with a ``.guardrailsrc`` that turns Guardrails' telemetry and remote
inference off: nothing leaves the machine, and what is timed is the validation alone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

GUARDRAILS_VERSION = "0.6.8"
ROOT = Path(__file__).resolve().parents[3]
VENV = ROOT / ".venv-bench" / f"guardrails-ai-{GUARDRAILS_VERSION}"
RUNNER = Path(__file__).with_name("guardrails_runner.py")
INSTALL_TIMEOUT_S = 900
RUN_TIMEOUT_S = 600
RC = "enable_metrics=false\nuse_remote_inferencing=false\n"


def ensure_env() -> Path:
    """The environment's python, created and installed on first use."""
    python = VENV / "bin" / "python"
    stamp = VENV / ".installed"
    if not stamp.exists():
        VENV.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(VENV)], check=True, timeout=120)
        subprocess.run(
            [
                str(python),
                "-m",
                "pip",
                "install",
                "-q",
                "--disable-pip-version-check",
                f"guardrails-ai=={GUARDRAILS_VERSION}",
            ],
            check=True,
            timeout=INSTALL_TIMEOUT_S,
        )
        stamp.touch()
    return python


def measure(text: str, *, warmup: int, requests: dict[int, int]) -> dict[int, dict[str, Any]]:
    """Latencies (ms) and wall seconds at each concurrency (1 and 16)."""
    python = ensure_env()
    cfg = json.dumps({"text": text, "warmup": warmup, "requests": {str(k): v for k, v in requests.items()}})
    with tempfile.TemporaryDirectory() as home:
        Path(home, ".guardrailsrc").write_text(RC)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("CROSSAUDIT_", "OPENAI_", "GUARDRAILS_"))}
        env |= {"HOME": home, "OTEL_SDK_DISABLED": "true"}
        # -I: the runner's own directory must not shadow the peer's packages
        proc = subprocess.run(
            [str(python), "-I", str(RUNNER), cfg], env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S
        )
    if proc.returncode != 0:
        raise subprocess.SubprocessError(f"the Guardrails run failed: {proc.stderr.strip()[-500:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    return {int(k): v for k, v in out.items()}
