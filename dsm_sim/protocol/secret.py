"""The shared secret of a handler server (``dsm serve --tcp``, ``memory.js --tcp``).

A handler server holds a store: anyone who can connect can read every
tenant's payloads, and with a ``now`` of their choosing sweep live locks and
expire finished records, after which finished work is done again.  So every
connection proves it knows the server's secret, in its ``open`` request
(``"secret"``), before the server builds or shares a handler for it.

Where the secret comes from, on both sides, first found wins:

1. ``DSM_SERVE_SECRET``: the secret itself;
2. ``DSM_SERVE_SECRET_FILE``: a file holding it (``--secret-file`` for the server);
3. on a loopback address only: the file the server wrote when it started,
   ``<cache dir>/serve/<host>-<port>.secret`` (mode 0600, so other local
   users cannot read it; removed when the server stops), which the harness
   finds by the address it connects to.

A server that listens on any other address needs 1 or 2: it refuses to
start without a secret, since a secret written only to its own machine would
leave remote clients no way in and a server with none would let anyone in.
"""

from __future__ import annotations

import contextlib
import hmac
import ipaddress
import os
import secrets
import stat
from collections.abc import Mapping
from pathlib import Path

from dsm_sim.conformance.cache import cache_dir
from reference_engine.errors import ConfigurationError

__all__ = [
    "SECRET_ENV",
    "SECRET_FILE_ENV",
    "ServerSecret",
    "client_secret",
    "is_loopback",
    "matches",
    "secret_path",
    "server_secret",
]

SECRET_ENV = "DSM_SERVE_SECRET"
SECRET_FILE_ENV = "DSM_SERVE_SECRET_FILE"
#: The longest secret read from a file: a token, not a document.
MAX_SECRET_BYTES = 4096


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine only (127.0.0.0/8, ::1, ``localhost``)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def secret_path(host: str, port: int, env: Mapping[str, str] | None = None) -> Path:
    """Where a loopback server started without a secret writes the one it drew."""
    safe_host = host.replace(":", "_").replace("/", "_")
    return cache_dir(env=env) / "serve" / f"{safe_host}-{port}.secret"


def _read_secret_file(path: Path, source: str) -> str:
    try:
        if not stat.S_ISREG(path.stat().st_mode):  # a FIFO would block the read for good
            raise ConfigurationError(f"the secret file {str(path)!r} ({source}) is not a file")
        with path.open("rb") as file:
            raw = file.read(MAX_SECRET_BYTES + 1)
    except OSError as exc:
        raise ConfigurationError(
            f"cannot read the secret file {str(path)!r} ({source}): {exc}"
        ) from None
    text = raw.decode("utf-8", "replace").strip()
    if not text or len(raw) > MAX_SECRET_BYTES:
        raise ConfigurationError(
            f"the secret file {str(path)!r} ({source}) must hold one secret of 1 to "
            f"{MAX_SECRET_BYTES} bytes"
        )
    return text


def _configured(env: Mapping[str, str], secret_file: str | None) -> str | None:
    """The secret the environment or a ``--secret-file`` gives, if any."""
    given = env.get(SECRET_ENV, "").strip()
    if given:
        return given
    if secret_file:
        return _read_secret_file(Path(secret_file), "--secret-file")
    named = env.get(SECRET_FILE_ENV, "").strip()
    if named:
        return _read_secret_file(Path(named), SECRET_FILE_ENV)
    return None


def client_secret(host: str, port: int, env: Mapping[str, str] | None = None) -> str | None:
    """The secret a harness sends to the server at ``host:port``, or None if it knows none."""
    environ = os.environ if env is None else env
    configured = _configured(environ, None)
    if configured is not None or not is_loopback(host):
        return configured
    path = secret_path(host, port, environ)
    try:
        return _read_secret_file(path, "written by the server")
    except ConfigurationError:
        return None  # the server drew none, or another user's: the server says what it wants


class ServerSecret:
    """The secret a server checks, and the file it wrote it to (removed when it stops)."""

    def __init__(self, value: str, written: Path | None = None) -> None:
        self.value = value
        self.written = written

    def write_for(self, host: str, port: int, env: Mapping[str, str] | None = None) -> None:
        """Write a drawn secret where a harness on this machine finds it, readable by us only."""
        path = secret_path(host, port, env)
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        temporary = path.with_name(f".{path.name}.{os.getpid()}")
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
        descriptor = os.open(temporary, flags, 0o600)
        with os.fdopen(descriptor, "w", encoding="utf-8") as file:
            file.write(self.value + "\n")
        os.replace(temporary, path)
        self.written = path

    def remove(self) -> None:
        if self.written is not None:
            with contextlib.suppress(OSError):
                self.written.unlink()
            self.written = None


def server_secret(
    host: str, secret_file: str | None = None, env: Mapping[str, str] | None = None
) -> tuple[ServerSecret, bool]:
    """The secret a server at ``host`` checks, and whether it was drawn (to be written).

    A non-loopback address without a configured secret is a usage error.
    """
    environ = os.environ if env is None else env
    configured = _configured(environ, secret_file)
    if configured is not None:
        return ServerSecret(configured), False
    if not is_loopback(host):
        raise ConfigurationError(
            f"--tcp on {host!r}, which is not a loopback address, needs a shared "
            f"secret: set {SECRET_ENV} (or --secret-file PATH / {SECRET_FILE_ENV}) here and in "
            "the harness's environment. Without one anyone who can reach the port could read "
            "every tenant's records and sweep live locks"
        )
    return ServerSecret(secrets.token_urlsafe(32)), True


def matches(expected: str, given: object) -> bool:
    """Whether ``given`` is the secret, compared in constant time."""
    if not isinstance(given, str):
        return False
    return hmac.compare_digest(
        expected.encode("utf-8", "surrogatepass"), given.encode("utf-8", "surrogatepass")
    )
