"""Runs inside the Guardrails AI environment the peer benchmark creates (not CrossAudit's).

Ten validators equivalent to the benchmark policy's ten rules (tests/e2e/policies.py
``ten_rules``): odd rules check a forbidden keyword, even rules a length bound, each as a
Guardrails custom validator with ``on_fail=noop`` (report, do not fix), on one Guard. Prints
one JSON document: latencies (ms) and wall seconds at 1 and 16 concurrent callers.
"""

import asyncio
import json
import sys
import time
from typing import Any

from guardrails import AsyncGuard, Guard, OnFailAction
from guardrails.validator_base import FailResult, PassResult, Validator, register_validator


@register_validator(name="crossaudit-bench/no-keyword", data_type="string")
class NoKeyword(Validator):
    def _validate(self, value: Any, metadata: dict) -> Any:
        return FailResult(error_message="forbidden word") if "forbidden" in value else PassResult()


@register_validator(name="crossaudit-bench/max-length", data_type="string")
class MaxLength(Validator):
    def _validate(self, value: Any, metadata: dict) -> Any:
        return PassResult() if len(value) < 10000 else FailResult(error_message="too long")


def validators():
    return [(NoKeyword if i % 2 else MaxLength)(on_fail=OnFailAction.NOOP) for i in range(10)]


def main() -> None:
    cfg = json.loads(sys.argv[1])
    text, warmup, per_level = cfg["text"], cfg["warmup"], cfg["requests"]
    guard = Guard().use_many(*validators())
    for _ in range(warmup):
        assert guard.validate(text).validation_passed
    out: dict[str, Any] = {}
    lat = []
    t0 = time.perf_counter()
    for _ in range(per_level["1"]):
        t = time.perf_counter()
        guard.validate(text)
        lat.append((time.perf_counter() - t) * 1000)
    out["1"] = {"latencies_ms": lat, "wall_s": time.perf_counter() - t0}

    aguard = AsyncGuard().use_many(*validators())

    async def level(concurrency: int, total: int) -> dict[str, Any]:
        lat: list = []

        async def worker() -> None:
            for _ in range(total // concurrency):
                t = time.perf_counter()
                await aguard.validate(text)
                lat.append((time.perf_counter() - t) * 1000)

        for _ in range(warmup):
            await aguard.validate(text)
        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return {"latencies_ms": lat, "wall_s": time.perf_counter() - t0}

    out["16"] = asyncio.run(level(16, per_level["16"]))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
