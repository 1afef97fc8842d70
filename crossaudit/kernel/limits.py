"""Every limit of the platform, named once, documented once (see ``docs/limits.md``).

Each limit is one typed field of a frozen dataclass, declared once with its default, its
constraint (the types below) and its description; the service's settings, flags, ``config show``
and docs/limits.md are derived from these fields (``crossaudit.service.settings``,
``python -m tools.generate_settings_docs``). Code and tests build the dataclasses directly
(tighter limits in tests); the settings validate each field against its constraint. Nothing else
in the code base hard-codes a limit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from pydantic import ConfigDict, Field

# The constraints limits share. A number must be finite; most must be positive, a few may be 0
# where 0 means something (no margin, no retry, no wait, no warm container).
PositiveInt = Annotated[int, Field(ge=1)]
NonNegativeInt = Annotated[int, Field(ge=0)]
PositiveFloat = Annotated[float, Field(gt=0, allow_inf_nan=False)]
NonNegativeFloat = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Fraction = Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]
Port = Annotated[int, Field(ge=0, le=65535)]  # 0 = an ephemeral port

# Every dataclass that is a section of the settings refuses a key it does not have (a typo), where
# pydantic validates it (``__pydantic_config__``); building one in code is unchanged.
SETTINGS_SECTION = ConfigDict(extra="forbid")


@dataclass(frozen=True)
class PolicyLimits:
    """Caps applied while *loading* a policy, before any model is built."""

    __pydantic_config__ = SETTINGS_SECTION

    max_file_bytes: Annotated[PositiveInt, Field(description="a policy larger than 1 MB is refused unread")] = 1_000_000
    max_depth: Annotated[PositiveInt, Field(description="nesting of mappings/sequences")] = 32
    max_nodes: Annotated[PositiveInt, Field(description="total YAML nodes, counted as they are composed")] = 50_000
    max_aliases: Annotated[NonNegativeInt, Field(description="anchors/aliases: refused outright (billion-laughs)")] = 0
    max_rules: Annotated[PositiveInt, Field(description="rules in one policy")] = 500
    max_evaluators: Annotated[PositiveInt, Field(description="evaluators in one policy")] = 200
    max_regex_length: Annotated[PositiveInt, Field(description="`regex_match` pattern length")] = 1_000


@dataclass(frozen=True)
class SandboxLimits:
    """Resource caps for one custom-evaluator call, applied by every sandbox backend."""

    __pydantic_config__ = SETTINGS_SECTION

    timeout_s: Annotated[
        PositiveFloat, Field(description="wall clock, enforced from outside (kill the process group / container)")
    ] = 10.0
    cpu_s: Annotated[PositiveInt, Field(description="RLIMIT_CPU for the call's process")] = 10
    memory_bytes: Annotated[
        PositiveInt, Field(description="address space (process) / memory = memory+swap (docker)")
    ] = 256 * 1024 * 1024
    pids: Annotated[PositiveInt, Field(description="processes + threads")] = 64
    nofile: Annotated[PositiveInt, Field(description="open files")] = 64
    file_bytes: Annotated[
        PositiveInt, Field(description="largest file the code may write (RLIMIT_FSIZE)")
    ] = 1024 * 1024
    tmpfs_bytes: Annotated[PositiveInt, Field(description="/tmp size in a container (and /dev/shm)")] = 16 * 1024 * 1024
    tmpfs_inodes: Annotated[
        PositiveInt, Field(description="files + directories in /tmp (and /dev/shm): bounds what a call leaves behind")
    ] = 16_384
    ipc_objects: Annotated[
        PositiveInt,
        Field(description="docker: SysV shm segments, semaphore sets, message queues and POSIX queues, each"),
    ] = 64
    cleanup_s: Annotated[
        PositiveFloat,
        Field(description="the reset after each call (kill, wipe, IPC); beyond it the sandbox is retired"),
    ] = 2.0
    output_bytes: Annotated[
        PositiveInt, Field(description="captured stdout+stderr, each; the rest is dropped")
    ] = 64 * 1024
    result_bytes: Annotated[PositiveInt, Field(description="the JSON result document")] = 1024 * 1024
    cpus: Annotated[PositiveFloat, Field(description="docker --cpus")] = 1.0
    result_max_depth: Annotated[PositiveInt, Field(description="nesting of the returned document")] = 32
    result_max_violations: Annotated[PositiveInt, Field(description="violations in one result")] = 1_000
    container_memory_bytes: Annotated[
        PositiveInt, Field(description="docker: a warm container (parent + one call's child); memory = memory+swap")
    ] = 512 * 1024 * 1024
    frame_bytes: Annotated[
        PositiveInt, Field(description="docker/process: longest agent protocol line accepted from the sandbox")
    ] = 4 * 1024 * 1024
    code_bytes: Annotated[
        PositiveInt, Field(description="largest evaluator source accepted (upload, inline policy code, agent load)")
    ] = 256 * 1024
    nice: Annotated[
        NonNegativeInt,
        Field(
            description=(
                "process backend: the niceness (0-19, above 19 counts as 19; 0 = the server's own) of each agent and "
                "so of every call's process it forks: tenant code shares the cores among itself below the "
                "orchestrator, whose event loop answers every tenant. Docker containers are bounded by `cpus` instead"
            )
        ),
    ] = 10
    tenant_cpu_groups: Annotated[
        bool,
        Field(
            description=(
                "split the CPU between tenants before their processes: the process backend puts each tenant's agents "
                "in a control group of its own weighted by the tenant's `share:` (cgroup v1 `cpu.shares` 1024 x "
                "share, v2 `cpu.weight` 100 x share, under `crossaudit-<pid>` in the server's own cgroup, removed at "
                "close, stale trees swept at start); the docker backend creates each tenant's containers under a "
                "cgroup parent of its own (`/crossaudit/t-<hash>` with the cgroupfs driver, "
                "`crossaudit-t_<hash>.slice` with systemd), equal between tenants. Where the hierarchy is not "
                "writable the groups are off (the sandbox's info says why) and niceness alone applies "
                "(`sandbox/cpugroups.py`)"
            )
        ),
    ] = True


@dataclass(frozen=True)
class PoolLimits:
    """Warm-pool sizing for one evaluator version (docker backend)."""

    __pydantic_config__ = SETTINGS_SECTION

    min_size: Annotated[NonNegativeInt, Field(description="warm containers kept per evaluator version")] = 1
    max_size: Annotated[PositiveInt, Field(description="warm containers at most per evaluator version")] = 4
    spare_size: Annotated[
        NonNegativeInt,
        Field(
            description="ready sandboxes kept beyond those serving or resetting a call, within max_size, so the "
            "next call never waits for the previous call's reset (each costs one warm sandbox's memory)"
        ),
    ] = 1
    idle_timeout_s: Annotated[PositiveFloat, Field(description="idle warm pools are closed after this")] = 300.0
    queue_wait_s: Annotated[
        PositiveFloat, Field(description="longest wait for a free warm sandbox (bounded by the deadline too)")
    ] = 5.0
    start_timeout_s: Annotated[
        PositiveFloat, Field(description="container create + start + agent load (imports) before it counts as failed")
    ] = 30.0
    max_pools: Annotated[
        PositiveInt,
        Field(description="warm pools kept at once; the least recently used idle pool is closed beyond this"),
    ] = 64
    docker_threads: Annotated[PositiveInt, Field(description="bounded executor for blocking docker-py calls")] = 8


@dataclass(frozen=True)
class DependencyLimits:
    """Caps on declared pip dependencies of a custom evaluator."""

    __pydantic_config__ = SETTINGS_SECTION

    max_count: Annotated[PositiveInt, Field(description="declared dependencies")] = 20
    max_length: Annotated[PositiveInt, Field(description="length of one requirement")] = 100
    allowlist: Annotated[tuple[str, ...], Field(description="empty = any well-formed name")] = ()
    denylist: Annotated[tuple[str, ...], Field(description="package names refused")] = ()
    resolve_timeout_s: Annotated[
        PositiveFloat, Field(description="pip download + install of one dependency set on the host")
    ] = 600.0
    build_timeout_s: Annotated[
        PositiveFloat, Field(description="one docker image build (base, runner or dependency image)")
    ] = 900.0
    max_site_bytes: Annotated[
        PositiveInt, Field(description="installed size of one dependency set")
    ] = 2 * 1024 * 1024 * 1024


@dataclass(frozen=True)
class EngineLimits:
    """Caps of the decision engine."""

    __pydantic_config__ = SETTINGS_SECTION

    default_timeout_s: Annotated[PositiveFloat, Field(description="policy `settings.timeout` when unset")] = 30.0
    default_rule_timeout_s: Annotated[
        PositiveFloat, Field(description="evaluator timeout when neither rule nor policy sets one")
    ] = 15.0
    max_retries: Annotated[NonNegativeInt, Field(description="`settings.retries` is clamped to this")] = 5
    retry_backoff_s: Annotated[
        NonNegativeFloat, Field(description="first backoff; doubles per attempt, bounded by the deadline")
    ] = 0.05
    cache_entries: Annotated[PositiveInt, Field(description="LRU size of the result cache")] = 10_000
    evaluator_instances: Annotated[
        PositiveInt, Field(description="built evaluators kept (per policy version × name), LRU")
    ] = 1_000
    default_cache_duration_s: Annotated[
        PositiveFloat, Field(description="when caching is on without `cache_duration`")
    ] = 300.0
    max_content_bytes: Annotated[PositiveInt, Field(description="prompt + response of one request")] = 1024 * 1024
    max_tool_arguments_depth: Annotated[
        PositiveInt,
        Field(
            description=(
                "nesting of a tool call's arguments (JSON arrays and objects) at the `tool_call` stage; deeper is "
                "INVALID_ARGUMENT, checked before the arguments are parsed"
            )
        ),
    ] = 32
    max_tool_name_chars: Annotated[
        PositiveInt,
        Field(description="a tool's name and a tool call's id in an evaluation's context (tool.name, tool.call_id)"),
    ] = 256
    max_llm_response_bytes: Annotated[
        PositiveInt,
        Field(
            description=(
                "one LLM provider's HTTP answer, counted while it streams in (a declared larger `Content-Length` is "
                "refused before the body); answers are asked for uncompressed and a compressed one is refused, so the"
                " count is what the SDK holds. Over it: the rule's evaluator fails with a non-retryable "
                "`ProviderError` (`ResponseTooLargeError`) naming the setting"
            )
        ),
    ] = 4 * 1024 * 1024
