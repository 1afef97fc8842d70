"""The one way CrossAudit gets a Docker client: docker-py from the environment (``DOCKER_HOST`` or
the local socket), for the image builder, the sandbox and the model servers alike.

docker-py's ``timeout`` is whole seconds and applies to every call on the client; a fraction below
one would make it zero, so :func:`client_timeout` rounds down but never below one second.
"""

from __future__ import annotations

from typing import Any

from crossaudit.kernel.errors import ConfigurationError

DEFAULT_TIMEOUT_S = 60.0  # every daemon call of a client made without another timeout


def client_timeout(timeout_s: float) -> int:
    """docker-py's timeout for ``timeout_s``: whole seconds, at least one."""
    return max(1, int(timeout_s))


def docker_client(
    timeout_s: float = DEFAULT_TIMEOUT_S,
    *,
    purpose: str = "building images",
    ping: bool = True,
    max_pool_size: int | None = None,
) -> Any:
    """A docker-py ``DockerClient`` of the environment's daemon, pinged first unless ``ping`` is
    False; else ConfigurationError saying ``purpose`` needs the docker package or a daemon.
    ``max_pool_size``: connections kept to the daemon (docker-py's default when None)."""
    try:
        import docker
    except ImportError:
        raise ConfigurationError(f"{purpose} needs the docker package (pip install docker)") from None
    pool = {} if max_pool_size is None else {"max_pool_size": int(max_pool_size)}
    client = None
    try:
        client = docker.from_env(timeout=client_timeout(timeout_s), **pool)
        if ping:
            client.ping()
    except Exception as exc:
        if client is not None:
            client.close()
        raise ConfigurationError(f"{purpose} needs a Docker daemon; none answered: {exc}") from None
    return client


def docker_answers(timeout_s: float) -> bool:
    """True when a daemon answers a ping within ``timeout_s`` (the client is closed again)."""
    try:
        docker_client(timeout_s).close()
    except Exception:
        return False
    return True
