"""Bounded downloads of model files from their official sources (step 4 of the resolution order).

The only module of CrossAudit's model code that opens a connection. Every download is bounded
in size (:class:`~crossaudit.modelserver.store.ModelStoreLimits`: ``Content-Length`` is checked
first, the bytes received as they arrive), in time (connect, read silence and the whole transfer)
and in redirects; its SHA-256 is computed while it streams and compared with a hash the source
publishes when there is one: the ``-<hex>.`` prefix in a torch hub file name (Detoxify's release
names carry it, as ``torch.hub`` checks), or a Hugging Face ``X-Linked-Etag`` (the SHA-256 of an
LFS file). A failure is a :class:`DownloadError` naming the URL and what went wrong.
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

# Declared in the one hierarchy, so a peer that imports only the codec decodes it; re-exported.
from crossaudit.kernel.errors import DownloadError as DownloadError
from crossaudit.modelserver.store import DEFAULT_LIMITS, PRIVATE_FILE_MODE, ModelStoreLimits

# torch.hub.HASH_REGEX: "<name>-<sha256 prefix>.<ext>" (at least 8 hex digits, as torch.hub checks)
_HUB_HASH_RE = re.compile(r"-([a-f0-9]{8,64})\.")
_SHA256_RE = re.compile(r"[a-f0-9]{64}")
USER_AGENT = "crossaudit-models"


@dataclass(frozen=True)
class Downloaded:
    url: str
    sha256: str
    size: int
    verified: str  # which published hash was checked ("" = the source publishes none)


def published_hash_prefix(url: str) -> str:
    """The SHA-256 prefix a torch-hub-style file name carries ('' when none)."""
    m = _HUB_HASH_RE.search(os.path.basename(urlsplit(url).path))
    return m.group(1) if m else ""


def check_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("https", "http") or not parts.hostname:
        raise DownloadError(f"cannot download {url!r}: only http(s) URLs are accepted")
    return url


def download(
    url: str,
    dest: Path,
    *,
    limits: ModelStoreLimits = DEFAULT_LIMITS,
    expected_sha256: str = "",
    optional: bool = False,
) -> Downloaded | None:
    """Stream ``url`` into the new file ``dest`` (0600). ``optional``: a 404 returns None instead of failing."""
    import httpx

    check_url(url)
    deadline = time.monotonic() + limits.download_timeout_s
    connect = limits.download_connect_timeout_s
    timeout = httpx.Timeout(limits.download_read_timeout_s, connect=connect, pool=connect)
    digest, size = hashlib.sha256(), 0

    def no_downgrade(request: httpx.Request) -> None:
        # Runs for each request, redirects included: an https source that redirects to plain http
        # would let anyone on the path swap a pickled checkpoint (or a pipeline whose source
        # publishes no hash). Refused before that request is sent.
        if urlsplit(url).scheme == "https" and request.url.scheme != "https":
            raise DownloadError(
                f"downloading {url} refused: it redirects from https to {request.url.scheme}://{request.url.host}"
            )

    try:
        with httpx.Client(
            follow_redirects=True, max_redirects=limits.max_redirects, timeout=timeout,
            headers={"User-Agent": USER_AGENT}, event_hooks={"request": [no_downgrade]},
        ) as client, client.stream("GET", url) as resp:
            if resp.status_code == 404 and optional:
                return None
            if resp.status_code != 200:
                raise DownloadError(f"downloading {url} failed: HTTP {resp.status_code}")
            declared = resp.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > limits.max_file_bytes:
                raise DownloadError(
                    f"downloading {url} refused: {declared} bytes is more than the limit of {limits.max_file_bytes}"
                )
            linked = resp.headers.get("x-linked-etag", "").strip('"').lower()
            fd = os.open(dest, os.O_CREAT | os.O_EXCL | os.O_WRONLY, PRIVATE_FILE_MODE)
            with os.fdopen(fd, "wb") as fh:
                # No chunk size: iter_bytes(n) yields only once n bytes have arrived, so a server
                # trickling a byte per second would never reach the deadline check below (the read
                # timeout only bounds silence). Unsized, each network read is a chunk and is checked.
                for chunk in resp.iter_bytes():
                    size += len(chunk)
                    if size > limits.max_file_bytes:
                        raise DownloadError(f"downloading {url} stopped: more than {limits.max_file_bytes} bytes")
                    if time.monotonic() > deadline:
                        raise DownloadError(
                            f"downloading {url} stopped: not finished within {limits.download_timeout_s:.0f} s"
                        )
                    digest.update(chunk)
                    fh.write(chunk)
                fh.flush()
                os.fsync(fh.fileno())
    except httpx.HTTPError as exc:
        dest.unlink(missing_ok=True)
        raise DownloadError(f"downloading {url} failed: {type(exc).__name__}: {exc}") from None
    except BaseException:
        dest.unlink(missing_ok=True)
        raise
    sha = digest.hexdigest()
    checks = []
    if expected_sha256:
        checks.append(("the expected SHA-256", expected_sha256.lower()))
    if prefix := published_hash_prefix(url):
        checks.append(("the SHA-256 prefix in its file name", prefix))
    if _SHA256_RE.fullmatch(linked):
        checks.append(("the source's X-Linked-Etag", linked))
    for what, want in checks:
        if not sha.startswith(want):
            dest.unlink(missing_ok=True)
            raise DownloadError(f"downloaded {url} has SHA-256 {sha}, which does not match {what} ({want})")
    return Downloaded(url=url, sha256=sha, size=size, verified=", ".join(w for w, _ in checks))
