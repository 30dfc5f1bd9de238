"""``loomlab serve``: an OpenAI-compatible HTTP API over a loaded model (no Qt).

:class:`Server` runs it on a thread (the CLI and the window's Server panel both use it);
:class:`RequestLog` is what its ``on_log`` reports for each request; :class:`ConnectionLimits`
bounds its connections (docs/serving.md lists what a request may carry and every limit).
"""

from .connections import ConnectionLimits
from .middleware import RequestLog
from .server import ServeError, Server

__all__ = ["ConnectionLimits", "RequestLog", "ServeError", "Server"]
