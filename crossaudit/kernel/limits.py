"""Every limit of the platform, named once, documented once (see ``docs/limits.md``).

Each dataclass holds defaults; the service builds them from configuration / flags, and
tests build tighter ones. Nothing else in the code base hard-codes a limit.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PolicyLimits:
    """Caps applied while *loading* a policy, before any model is built."""

    max_file_bytes: int = 1_000_000  # a policy larger than 1 MB is refused unread
    max_depth: int = 32  # nesting of mappings/sequences
    max_nodes: int = 50_000  # total YAML nodes, counted as they are composed
    max_aliases: int = 0  # anchors/aliases: refused outright (billion-laughs)
    max_rules: int = 500
    max_evaluators: int = 200
    max_regex_length: int = 1_000


@dataclass(frozen=True)
class SandboxLimits:
    """Resource caps for one custom-evaluator call, applied by every sandbox backend."""

    timeout_s: float = 10.0  # wall clock, enforced from outside (kill the process group / container)
    cpu_s: int = 10  # RLIMIT_CPU for the call's process
    memory_bytes: int = 256 * 1024 * 1024  # address space (process) / memory = memory+swap (docker)
    pids: int = 64  # processes + threads
    nofile: int = 64  # open files
    file_bytes: int = 1024 * 1024  # largest file the code may write (RLIMIT_FSIZE)
    tmpfs_bytes: int = 16 * 1024 * 1024  # /tmp size in a container (and /dev/shm)
    tmpfs_inodes: int = 16_384  # files + directories in /tmp (and /dev/shm): bounds what a call leaves behind
    ipc_objects: int = 64  # docker: SysV shm segments, semaphore sets, message queues and POSIX queues, each
    cleanup_s: float = 2.0  # the reset after each call (kill, wipe, IPC); beyond it the sandbox is retired
    output_bytes: int = 64 * 1024  # captured stdout+stderr, each; the rest is dropped
    result_bytes: int = 1024 * 1024  # the JSON result document
    cpus: float = 1.0  # docker --cpus
    result_max_depth: int = 32  # nesting of the returned document
    result_max_violations: int = 1_000
    container_memory_bytes: int = (
        512 * 1024 * 1024
    )  # docker: a warm container (parent + one call's child); = memory+swap
    frame_bytes: int = 4 * 1024 * 1024  # docker/process: longest agent protocol line accepted from the sandbox
    code_bytes: int = 256 * 1024  # largest evaluator source accepted (upload, inline policy code, agent load)
    # process backend: the agent and every call's process run at this niceness (0-19; 0 = the
    # server's own), so tenant code never outranks the orchestrator, which answers every tenant
    nice: int = 10
    # Split the CPU between tenants before their processes: a control group per tenant weighted
    # by its share (process backend), a cgroup parent per tenant (docker backend); see
    # sandbox/cpugroups.py. Off: niceness (process) and ``cpus`` (docker) alone.
    tenant_cpu_groups: bool = True


@dataclass(frozen=True)
class PoolLimits:
    """Warm-pool sizing for one evaluator version (docker backend)."""

    min_size: int = 1
    max_size: int = 4
    idle_timeout_s: float = 300.0
    queue_wait_s: float = 5.0  # longest wait for a free warm sandbox (bounded by the deadline too)
    start_timeout_s: float = 30.0  # container create + start + agent load (imports) before it counts as failed
    max_pools: int = 64  # warm pools kept at once; the least recently used idle pool is closed beyond this
    docker_threads: int = 8  # bounded executor for blocking docker-py calls


@dataclass(frozen=True)
class DependencyLimits:
    """Caps on declared pip dependencies of a custom evaluator."""

    max_count: int = 20
    max_length: int = 100
    allowlist: tuple[str, ...] = ()  # empty = any well-formed name
    denylist: tuple[str, ...] = ()
    resolve_timeout_s: float = 600.0  # pip download + install of one dependency set on the host
    build_timeout_s: float = 900.0  # one docker image build (base, runner or dependency image)
    max_site_bytes: int = 2 * 1024 * 1024 * 1024  # installed size of one dependency set


@dataclass(frozen=True)
class EngineLimits:
    """Caps of the decision engine."""

    default_timeout_s: float = 30.0  # policy ``settings.timeout`` when unset
    default_rule_timeout_s: float = 15.0  # evaluator timeout when neither rule nor policy sets one
    max_retries: int = 5  # ``settings.retries`` is clamped to this
    retry_backoff_s: float = 0.05  # first backoff; doubles per attempt, bounded by the deadline
    cache_entries: int = 10_000  # LRU size of the result cache
    evaluator_instances: int = 1_000  # built evaluators kept (per policy version × name), LRU
    default_cache_duration_s: float = 300.0
    max_content_bytes: int = 1024 * 1024  # prompt + response of one request
    # Bytes of one LLM provider's HTTP answer, counted while they stream in (a hostile endpoint
    # could otherwise make the orchestrator hold gigabytes before any other cap applies).
    max_llm_response_bytes: int = 4 * 1024 * 1024
