"""What bounds the server's connections, so one client cannot take the server from the others.

uvicorn alone keeps a connection for as long as its client trickles (or withholds) a request's
head, and accepts connections until the process runs out of file descriptors; then every
accept fails and asyncio reports each failure with a traceback. Here:

- at most ``max_connections`` are open: one past that gets a 503 and is closed at once;
- a request's head (its line and headers) must arrive within ``head_timeout_s`` of the connection
  opening or of the previous reply on it (keep-alive), however it trickles;
- a body must arrive within ``body_timeout_s`` (:class:`~.middleware.BodyDeadline`);
- running out of descriptors is one warning line per interval, not a traceback per accept.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import resource
import time
from dataclasses import dataclass

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from loomlab.core.errors import LoomConfigError

log = logging.getLogger(__name__)
BUSY = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain\r\nconnection: close\r\n"
        b"content-length: 34\r\n\r\nthe server has too many connections")
RESOURCE_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
WARN_EVERY_S = 10.0  # how often running out of descriptors is reported while it lasts


@dataclass(frozen=True)
class ConnectionLimits:
    max_connections: int
    head_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    keep_alive_s: float = 5.0  # an idle keep-alive connection is closed after this

    def __post_init__(self):
        n = self.max_connections
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise LoomConfigError(f"max_connections must be an integer >= 1, got {n!r}")
        for name in ("head_timeout_s", "body_timeout_s", "keep_alive_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 3600:
                raise LoomConfigError(f"{name} must be a number of seconds in (0, 3600), got {value!r}")

    @property
    def backlog(self) -> int:
        """Connections the kernel queues before we accept them (a burst; more are refused)."""
        return min(self.max_connections, 128)


def default_max_connections() -> int:
    """Half the descriptors this process may open (the model's files, the tokenizer and the rest
    keep the other half), at most 1024."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return max(8, min(1024, soft // 2)) if soft != resource.RLIM_INFINITY else 1024


def protocol_class(limits: ConnectionLimits) -> type[H11Protocol]:
    """uvicorn's h11 protocol with ``limits`` on connections and on the time to send a head."""

    class Bounded(H11Protocol):
        def connection_made(self, transport) -> None:
            self.head_deadline: asyncio.TimerHandle | None = None
            super().connection_made(transport)
            if len(self.connections) > limits.max_connections:
                transport.write(BUSY)
                transport.close()
                return
            self.arm_head_deadline()

        def arm_head_deadline(self) -> None:
            self.disarm_head_deadline()
            self.head_deadline = self.loop.call_later(limits.head_timeout_s, self.head_timed_out)

        def disarm_head_deadline(self) -> None:
            if self.head_deadline is not None:
                self.head_deadline.cancel()
                self.head_deadline = None

        def head_timed_out(self) -> None:
            self.head_deadline = None
            if not self.transport.is_closing():
                self.transport.close()

        def handle_events(self) -> None:
            cycle = self.cycle
            super().handle_events()
            if self.cycle is not cycle:  # a whole head arrived: its request runs
                self.disarm_head_deadline()

        def on_response_complete(self) -> None:
            # armed first: the parent may start a pipelined request at once (which disarms it)
            self.arm_head_deadline()
            super().on_response_complete()

        def connection_lost(self, exc) -> None:
            self.disarm_head_deadline()
            super().connection_lost(exc)

    return Bounded


class BoundedServer(uvicorn.Server):
    """uvicorn's server whose event loop reports running out of descriptors as one line per
    :data:`WARN_EVERY_S` (with how many accepts failed) instead of a traceback for each."""

    async def startup(self, sockets=None) -> None:
        asyncio.get_running_loop().set_exception_handler(ResourceWarnings())
        await super().startup(sockets=sockets)


class ResourceWarnings:
    """An asyncio exception handler: resource exhaustion counted and summarised, the rest passed
    to the loop's default handler."""

    def __init__(self):
        self.failed = 0
        self.last = float("-inf")

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict) -> None:
        exc = context.get("exception")
        if not (isinstance(exc, OSError) and exc.errno in RESOURCE_ERRNOS):
            loop.default_exception_handler(context)
            return
        self.failed += 1
        now = time.monotonic()
        if now - self.last >= WARN_EVERY_S:
            log.warning("out of system resources (%s): %d connection(s) not accepted since the last "
                        "warning; lower the client load or raise the open-files limit (ulimit -n)",
                        exc.strerror, self.failed)
            self.failed, self.last = 0, now
