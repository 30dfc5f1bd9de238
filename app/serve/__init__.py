"""``loomlab serve``: an OpenAI-compatible HTTP API over a loaded model (no Qt).

:class:`Server` runs it on a thread (the CLI and the window's Server panel both use it);
:class:`RequestLog` is what its ``on_log`` reports for each request.
"""

from .middleware import RequestLog
from .server import ServeError, Server

__all__ = ["RequestLog", "ServeError", "Server"]
