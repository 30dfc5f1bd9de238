"""The OpenAI-compatible server as an object: a batch engine over a loaded model, the routes, and
uvicorn running them on a thread of its own, so the CLI (``loomlab serve``) and the window's
Server panel start and stop it the same way."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable

import uvicorn

from loomlab.core.errors import LoomConfigError, LoomError
from loomlab.core.llm.generate.batching import BatchEngine
from loomlab.core.llm.generate.textmodel import TextModel

from .connections import BoundedServer, ConnectionLimits, default_max_connections, protocol_class
from .metrics import ServerMetrics
from .middleware import BodyDeadline, Guard, RequestLog
from .routes import Context, make_app

START_TIMEOUT_S = 30.0
GRACE_S = 5.0  # how long stop() lets open connections finish before closing them


class ServeError(LoomError):
    """The server could not start (the address is taken or cannot be used) or is misused."""


class Server:
    """Serves ``model`` (a loaded TextModel, which the server does not close) over HTTP.

    ``port=0`` picks a free port (see :attr:`url` after :meth:`start`); ``api_key`` makes every
    route but /health ask for ``Authorization: Bearer KEY``; ``max_batch`` sequences are decoded
    together; ``model_name`` is the name clients use (the model's own by default); ``on_log(entry)``
    gets a :class:`RequestLog` when each request starts (status 0) and when it ends, called from
    the server's thread. ``limits`` bounds connections and the time to send a request
    (:mod:`.connections`; by default half the process's open-files limit, 10 s for a head, 30 s
    for a body).
    """

    def __init__(self, model: TextModel, *, host: str = "127.0.0.1", port: int = 8080,
                 api_key: str | None = None, max_batch: int = 8, model_name: str | None = None,
                 on_log: Callable[[RequestLog], None] | None = None,
                 speculative: str | None = "prompt-lookup", limits: ConnectionLimits | None = None):
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise LoomConfigError(f"port must be an integer in 0..65535, got {port!r}")
        if api_key is not None and (not isinstance(api_key, str) or not api_key.strip()):
            raise LoomConfigError("api_key must be a non-empty string (or None for no key)")
        if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
            raise LoomConfigError(f"max_batch must be an integer >= 1, got {max_batch!r}")
        if limits is not None and not isinstance(limits, ConnectionLimits):
            raise LoomConfigError(f"limits must be a ConnectionLimits, got {limits!r}")
        if speculative not in (None, "prompt-lookup"):
            raise LoomConfigError(f"speculative must be None or 'prompt-lookup', got {speculative!r}")
        self.model, self.host, self.port = model, host, port
        self.api_key, self.max_batch = api_key, max_batch
        self.model_name = model_name or model.name or "model"
        self.on_log = on_log
        self.speculative = speculative  # "prompt-lookup": greedy requests speculate (same output)
        self.limits = limits or ConnectionLimits(default_max_connections())
        self.url = ""
        self._engine: BatchEngine | None = None
        self._uvicorn: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._socket: socket.socket | None = None
        self._stopping = False

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._stopping

    def stats(self) -> dict:
        """The batch engine's figures (``BatchEngine.stats``); empty while stopped."""
        return self._engine.stats() if self._engine is not None else {}

    def start(self) -> str:
        """Listen and serve; returns the base URL (``http://host:port/v1``) once connections are
        accepted. Raises :class:`ServeError` if the address cannot be bound."""
        if self._thread is not None:
            raise ServeError("the server is already started (stop it first)")
        sock = self._bind()
        port = sock.getsockname()[1]
        self._stopping = False
        self._socket = sock
        self._engine = BatchEngine(self.model, max_batch=self.max_batch, speculate_greedy=self.speculative)
        metrics = ServerMetrics(self._engine.stats)
        ctx = Context(self.model, self._engine, self.model_name, metrics, int(time.time()),
                      lambda: self._stopping)
        limits = self.limits
        app = Guard(BodyDeadline(make_app(ctx), limits.body_timeout_s), api_key=self.api_key,
                    metrics=metrics, on_log=self.on_log)
        config = uvicorn.Config(app, loop="asyncio", http=protocol_class(limits), ws="none",
                                lifespan="off", log_config=None, access_log=False,
                                timeout_graceful_shutdown=GRACE_S, timeout_keep_alive=limits.keep_alive_s,
                                # uvicorn's 503 past this many connections or running requests
                                # (one a connection): ours refuses the connection itself first
                                limit_concurrency=limits.max_connections + 1, backlog=limits.backlog)
        self._uvicorn = BoundedServer(config)
        self._thread = threading.Thread(target=self._uvicorn.run, kwargs={"sockets": [sock]},
                                        name="loomlab-serve", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._uvicorn.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise ServeError(f"the server on {self.host}:{port} did not start")
            time.sleep(0.01)
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.url = f"http://{host}:{port}/v1"
        return self.url

    def stop(self) -> None:
        """Cancel every generation, close the engine and the server, free the port; idempotent."""
        self._stopping = True  # new requests get 503 from here on
        if self._engine is not None:
            self._engine.close()  # open streams end (their requests get "cancelled" records)
            self._engine = None
        if self._thread is not None:
            self._uvicorn.should_exit = True
            self._thread.join(GRACE_S + 5)
            if self._thread.is_alive():  # a connection that would not close: drop them all
                self._uvicorn.force_exit = True
                self._thread.join()
            self._thread = self._uvicorn = None
        if self._socket is not None:
            self._socket.close()
            self._socket = None

    def __enter__(self) -> Server:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _bind(self) -> socket.socket:
        try:
            infos = socket.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        except OSError as e:
            raise ServeError(f"cannot listen on {self.host}: {e}") from None
        family, kind, proto, _, address = infos[0]
        sock = socket.socket(family, kind, proto)
        try:
            # as uvicorn does: a restarted server may take its port back from connections in TIME_WAIT
            # (a port another process listens on still refuses)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(address)
        except OSError as e:
            sock.close()
            raise ServeError(f"cannot listen on {self.host}:{self.port}: {e.strerror or e}") from None
        return sock
