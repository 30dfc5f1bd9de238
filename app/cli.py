"""The ``loomlab`` command.

With no arguments it opens the workbench; every other command is headless and never imports Qt
(the GUI module is imported inside :func:`main` only when it is needed). Errors print one line
on stderr and exit with status 2.
"""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import sys
import time
from collections.abc import Mapping

EXIT_ERROR = 2
EXIT_CANCELLED = 128 + 2  # as a shell reports a process ended by SIGINT
EXIT_TERMINATED = 128 + 15  # ... and by SIGTERM
# Qt platform plugins that draw without a display server (offscreen, framebuffer, VNC ...)
HEADLESS_QT_PLATFORMS = frozenset({"offscreen", "minimal", "minimalegl", "eglfs", "linuxfb", "vnc",
                                   "vkkhrdisplay"})
LOG_INTERVAL_S = 5.0  # progress written to a log (not a terminal): at most one line per stage this often


class CliError(Exception):
    """A user error: printed as one line, exit status 2."""


class Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse prints usage + message; we want one line
        raise CliError(message)


def build_parser() -> argparse.ArgumentParser:
    from loomlab.core import __version__

    p = Parser(prog="loomlab", description="Loom Lab: look inside neural networks and talk to them.",
               epilog="With no command, loomlab opens the workbench window; it needs a display "
                      "(without one: xvfb-run -a loomlab). Every command above runs without one.")
    p.add_argument("--version", action="version", version=f"loomlab {__version__}")
    add_gui_options(p.add_argument_group("workbench options (with no command)"))
    sub = p.add_subparsers(dest="command", parser_class=Parser)

    for module in _command_modules():
        module.register(sub)
    return p


def _command_modules():
    """Every module of :mod:`loomlab.app.commands`; each adds its subcommands with ``register``."""
    from . import commands

    return [importlib.import_module(f"{commands.__name__}.{m.name}")
            for m in pkgutil.iter_modules(commands.__path__)]


GUI_OPTIONS = ("--screenshot", "--panel", "--model", "--network", "--prompt", "--demo", "--backend")


def add_gui_options(p) -> None:
    """The options that open the workbench in a given state (in ``loomlab --help`` too)."""
    p.add_argument("--screenshot", metavar="PATH",
                   help="render the window to this PNG and exit (uses a throwaway workspace and settings)")
    p.add_argument("--panel", help="bring this panel to the front: models, chat, topology, inspect, "
                                   "telemetry, morph, run, dna, evolution, server")
    p.add_argument("--model", help="load this model (built-in alias, .gguf file or HF folder)")
    p.add_argument("--network", help="open this Loom network (.json or .loom)")
    p.add_argument("--prompt", help="send this message to the loaded model and wait for the reply "
                                    "(printed on stdout too)")
    p.add_argument("--demo", action="store_true",
                   help="fill the DNA and Evolution panels with an example: XOR's seed network against a "
                        "NEAT mutant, and 30 generations of a speciated XOR run")
    p.add_argument("--backend", type=_backend_name, metavar="NAME",
                   help="load models and networks on numpy, cupy or auto (default: the View > Backend "
                        "choice)")


def gui_parser() -> argparse.ArgumentParser:
    p = Parser(prog="loomlab", description="Open the workbench (optionally in a given state).")
    add_gui_options(p)
    return p


def display_problem(env: Mapping[str, str], platform: str = sys.platform) -> str | None:
    """Why the window cannot open here, or None. Checked before Qt starts: without a display Qt
    aborts the process (exit 134) with a hint about libxcb-cursor that sends people astray."""
    if not platform.startswith("linux"):
        return None  # macOS and Windows always have their window system
    qpa = env.get("QT_QPA_PLATFORM", "").split(":")[0]
    if qpa in HEADLESS_QT_PLATFORMS or env.get("DISPLAY") or env.get("WAYLAND_DISPLAY"):
        return None
    return ("no display to open the window on (DISPLAY and WAYLAND_DISPLAY are not set): run loomlab "
            "in a desktop session, under a virtual display (xvfb-run -a loomlab), or use the headless "
            "commands (loomlab --help)")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0].split("=")[0] in GUI_OPTIONS:
        try:
            options = gui_parser().parse_args(argv)
            problem = display_problem(os.environ)
            if problem is not None:
                raise CliError(problem)
        except CliError as e:
            print(f"loomlab: error: {e}", file=sys.stderr)
            return EXIT_ERROR
        from loomlab.app.gui import GuiOptions, run_gui  # the only path that loads Qt

        return run_gui(sys.argv[:1], GuiOptions(**vars(options)))
    try:
        args = build_parser().parse_args(argv)
        if getattr(args, "handler", None) is None:
            raise CliError("missing command; try 'loomlab --help'")
        return args.handler(args)
    except CliError as e:
        print(f"loomlab: error: {e}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt as e:
        from loomlab.core.io.atomic import Terminated

        if isinstance(e, Terminated):  # SIGTERM during a save: the temporary files are gone
            print("loomlab: terminated", file=sys.stderr)
            return EXIT_TERMINATED
        print("loomlab: cancelled", file=sys.stderr)
        return EXIT_CANCELLED
    except BrokenPipeError:  # output piped into e.g. `head`, which stopped reading: not an error
        sys.stderr.close()
        return 0
    except MemoryError:
        print("loomlab: error: out of memory (the input asks for more than this machine has)",
              file=sys.stderr)
        return EXIT_ERROR
    except RecursionError:
        print("loomlab: error: the input is nested too deeply to read", file=sys.stderr)
        return EXIT_ERROR
    except Exception as e:  # engine errors (LoomError, OSError ...) are user-facing one-liners
        from loomlab.core import LoomError

        if not isinstance(e, LoomError | OSError | ValueError):
            raise
        print(f"loomlab: error: {e}", file=sys.stderr)
        return EXIT_ERROR
    except BaseException as e:  # the Rust tokenizer's panic (pyo3 PanicException) is a BaseException
        if type(e).__name__ != "PanicException":
            raise
        print(f"loomlab: error: the tokenizer failed: {e}", file=sys.stderr)
        return EXIT_ERROR


BACKEND_HELP = ("array backend: numpy (default), cupy (an NVIDIA GPU; pip install 'loomlab[gpu]') or auto "
                "(cupy where a GPU is usable, else numpy)")


def add_backend_option(p) -> None:
    """``--backend NAME`` on a command that computes; its handler passes ``args.backend`` on to
    ``load_network`` / ``load_model``, which say why a backend cannot run here."""
    p.add_argument("--backend", default="numpy", type=_backend_name, metavar="NAME", help=BACKEND_HELP)


ACTIVATIONS_HELP = ("int8 (default): 8-bit activations for weights in GGUF block formats, as llama.cpp "
                    "computes (fast); float32: the exact path, as transformers computes")


def add_activations_option(p) -> None:
    """``--activations int8|float32`` and its short form ``--exact`` on a command that generates;
    its handler passes ``args.activations`` on to ``load_model``."""
    g = p.add_mutually_exclusive_group()
    g.add_argument("--activations", choices=("int8", "float32"), default="int8", help=ACTIVATIONS_HELP)
    g.add_argument("--exact", dest="activations", action="store_const", const="float32",
                   help="the exact path (--activations float32)")


SPECULATIVE_HELP = ("greedy requests speculate with prompt lookup (default; the same output, faster where "
                    "the reply repeats the prompt, stopped where it does not gain); off: one token a step")


def add_speculative_option(p) -> None:
    """``--speculative prompt-lookup|off`` on a command that generates: ``args.speculative`` is
    "prompt-lookup" or None (off), what generation takes."""
    p.add_argument("--speculative", type=_speculative, default="prompt-lookup", metavar="{prompt-lookup,off}",
                   help=SPECULATIVE_HELP)


def _speculative(text: str) -> str | None:
    if text not in ("prompt-lookup", "off"):
        raise argparse.ArgumentTypeError(f"choose prompt-lookup or off, not {text!r}")
    return None if text == "off" else text


def _backend_name(text: str) -> str:
    from loomlab.core.backend import backend_names

    names = backend_names()
    if text not in names:
        raise argparse.ArgumentTypeError(f"unknown backend {text!r}; choose from {', '.join(names)}")
    return text


def token_ids(text: str) -> list[int]:
    """``--ids 1,2,3`` as token ids; :class:`CliError` for anything but integers, or none."""
    try:
        ids = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise CliError(f"--ids must be integers separated by commas, got {text!r}") from None
    if not ids:
        raise CliError("--ids is empty")
    return ids


def print_table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    """Print rows under a header, columns padded to their widest cell."""
    table = [header, *rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for row in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


def progress_bar(stage: str, done: int, total: int) -> None:
    """A progress bar on stderr for (stage, done, total) reports: downloads, extraction, loading;
    a count for work of unknown length (total 0), such as a first run's kernel compilation."""
    if total <= 0:
        _progress_line(stage, f"{stage}: {done:,} done", False)
        return
    frac = done / total
    bar = "#" * int(frac * 30)
    _progress_line(stage, f"{stage:<8} [{bar:.<30}] {frac:6.1%} ({done:,}/{total:,})", done >= total)


def progress(done: int, total: int, what: str) -> None:
    """A step counter on stderr, ``[3/21] int8``, for work done in a known number of steps."""
    _progress_line("steps", f"[{done}/{total}] {what:<10}", done >= total)


_last_logged: dict[str, float] = {}  # stage -> when its last line went to a log


def _progress_line(stage: str, line: str, finished: bool) -> None:
    """On a terminal, redraw one line in place. In a log (stderr not a terminal) a redraw would
    pile up as ``\r`` garbage: write whole lines instead, the first and last of a stage and at
    most one every LOG_INTERVAL_S between."""
    if sys.stderr.isatty():
        print(f"\r{line}", end="\n" if finished else "", file=sys.stderr, flush=True)
        return
    now = time.monotonic()
    if finished or stage not in _last_logged or now - _last_logged[stage] >= LOG_INTERVAL_S:
        print(line.rstrip(), file=sys.stderr, flush=True)
        _last_logged[stage] = now
    if finished:
        _last_logged.pop(stage, None)


if __name__ == "__main__":
    sys.exit(main())
