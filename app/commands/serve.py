"""``loomlab serve MODEL``: an OpenAI-compatible HTTP API over a language model (no Qt)."""

from __future__ import annotations

import sys
import threading

from ..cli import CliError, add_activations_option, add_backend_option, add_speculative_option, progress_bar


def register(sub) -> None:
    p = sub.add_parser("serve", help="serve a language model over an OpenAI-compatible HTTP API",
                       description="Serve MODEL at http://HOST:PORT/v1 (chat/completions, completions, "
                                   "embeddings, models), with /health and /metrics (Prometheus). "
                                   "Ctrl-C stops it.")
    p.add_argument("model", help="a built-in alias (smollm2-135m, gemma3-270m), a .gguf file or an HF folder")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1; 0.0.0.0 opens it to the network)")
    p.add_argument("--port", type=int, default=8080, help="port (default 8080; 0 picks a free one)")
    p.add_argument("--api-key", help="require 'Authorization: Bearer KEY' on every route but /health")
    p.add_argument("--max-batch", type=int, default=8, help="sequences decoded together (default 8)")
    p.add_argument("--max-connections", type=int,
                   help="open connections at most; one more gets 503 (default: half the open-files limit, "
                        "at most 1024; docs/serving.md lists every limit)")
    add_speculative_option(p)
    p.add_argument("--name", help="the model name clients use (default: the model's own)")
    p.add_argument("--log", action="store_true", help="print one line per finished request on stderr")
    add_backend_option(p)
    add_activations_option(p)
    p.set_defaults(handler=cmd_serve)


def cmd_serve(args) -> int:
    from loomlab.app.serve import ConnectionLimits, Server
    from loomlab.app.serve.connections import default_max_connections
    from loomlab.core.llm.generate.textmodel import load_model

    if not 0 <= args.port <= 65535:
        raise CliError(f"--port must be in 0..65535, got {args.port}")
    if args.max_batch < 1:
        raise CliError(f"--max-batch must be >= 1, got {args.max_batch}")
    if args.max_connections is not None and args.max_connections < 1:
        raise CliError(f"--max-connections must be >= 1, got {args.max_connections}")
    limits = ConnectionLimits(args.max_connections or default_max_connections())
    with load_model(args.model, progress=progress_bar, backend=args.backend,
                    activations=args.activations) as model:
        server = Server(model, host=args.host, port=args.port, api_key=args.api_key, max_batch=args.max_batch,
                        model_name=args.name, on_log=_log_line if args.log else None,
                        speculative=args.speculative, limits=limits)
        url = server.start()
        try:
            print(f"serving {server.model_name} at {url} on {model.backend.name} (Ctrl-C stops)",
                  file=sys.stderr, flush=True)
            threading.Event().wait()  # until Ctrl-C (KeyboardInterrupt)
        except KeyboardInterrupt:
            print("loomlab: stopping", file=sys.stderr)
        finally:
            server.stop()
    return 0


def _log_line(entry) -> None:
    if entry.status == 0:
        return
    tokens = f" {entry.prompt_tokens}+{entry.completion_tokens} tokens {entry.tokens_per_s:.1f} tok/s" \
        if entry.completion_tokens else ""
    why = f" {entry.error}" if entry.error else ""
    print(f"{entry.method} {entry.path} {entry.status} {entry.duration_s * 1000:.0f} ms{tokens}{why}",
          file=sys.stderr, flush=True)
