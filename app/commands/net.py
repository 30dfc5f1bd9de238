"""``loomlab net ...``: inspect, run and morph Loom networks (headless, no Qt)."""

from __future__ import annotations

import io
import json
from dataclasses import asdict

import numpy as np

from ..cli import CliError, Parser, add_backend_option, print_table, progress


def register(sub) -> None:
    net = sub.add_parser("net", help="inspect and run Loom networks (JSON)")
    net_sub = net.add_subparsers(dest="net_command", parser_class=Parser, required=True)

    info = net_sub.add_parser("info", help="the layer table (blueprint) of a network")
    info.add_argument("network", help="a Loom JSON network file")
    info.add_argument("--json", action="store_true", help="print machine-readable JSON")
    info.set_defaults(handler=cmd_net_info)

    run = net_sub.add_parser("run", help="run an input through a network")
    run.add_argument("network", help="a Loom JSON network file")
    src = run.add_mutually_exclusive_group(required=True)
    src.add_argument("--input", metavar="IN.npy", help="input array (.npy)")
    src.add_argument("--input-json", metavar="JSON", help="input values as a JSON array")
    run.add_argument("--shape", help="input shape, e.g. 2,16 (default: the array's own; flat -> 1,N)")
    run.add_argument("--output", metavar="OUT.npy", help="write the output here instead of printing it")
    add_backend_option(run)
    run.set_defaults(handler=cmd_net_run)

    morph = net_sub.add_parser("morph", help="morph layer weights to another numeric type and save")
    morph.add_argument("network", help="a Loom JSON network or .loom checkpoint")
    which = morph.add_mutually_exclusive_group(required=True)
    which.add_argument("--layer", type=int, metavar="I", help="flat grid index of the layer")
    which.add_argument("--all", action="store_true", help="every weighted layer")
    morph.add_argument("--dtype", required=True, help="one of Loom's 21 dtypes (int8, fp4, ...)")
    morph.add_argument("-o", "--output", required=True, help="where to save (.json or .loom)")
    morph.add_argument("--json", action="store_true", help="print the report as JSON")
    morph.set_defaults(handler=cmd_net_morph)

    sweep = net_sub.add_parser("morph-report", help="bytes, weight error and output drift for every dtype")
    sweep.add_argument("network", help="a Loom JSON network or .loom checkpoint")
    sweep.add_argument("--input", metavar="IN.npy", help="probe input (default: seeded, from layer shapes)")
    sweep.add_argument("--seed", type=int, default=0,
                       help="seed of the default probe input (and of a build-schema network's weights)")
    sweep.add_argument("--json", action="store_true", help="print machine-readable JSON")
    add_backend_option(sweep)
    sweep.set_defaults(handler=cmd_net_morph_report)


# ----- net info ---------------------------------------------------------------------------
def load_net(path: str, backend: str = "numpy", seed: int | None = None):
    """The network in ``path`` (``seed`` draws a build-schema network's weights); an error inside
    the file also names the file (the engine's names only the JSON path, ``$.layers[3].weights``,
    since it may be reading text, not a file)."""
    from loomlab.core import LoomFormatError, load_network

    try:
        return load_network(path, backend=backend, seed=seed)
    except LoomFormatError as e:
        if e.path.startswith("$"):
            raise CliError(f"{path}: {e}") from None
        raise


def cmd_net_info(args) -> int:
    net = load_net(args.network)
    rows = net.blueprint()
    summary = net.summary()
    if args.json:
        print(json.dumps({**summary, "blueprint": [asdict(r) for r in rows]}, indent=2))
        return 0
    header = ("index", "z,y,x,l", "layer", "activation", "dtype", "params", "bytes", "in -> out")
    table = []
    for r in rows:
        name = f"{'  ' * r.path.count('[')}{r.type}" + (" (disabled)" if r.disabled else "")
        if r.remote_target is not None:
            name += f" -> {','.join(map(str, r.remote_target))}"
        table.append((str(r.index), f"{r.z},{r.y},{r.x},{r.l}", name, r.activation, r.dtype,
                      f"{r.parameters:,}", f"{r.bytes:,}", f"{r.input_shape} -> {r.output_shape}"))
    print_table(header, table)
    by_dtype = ", ".join(f"{k} {v:,} B" for k, v in summary["memory_by_dtype"].items()) or "none"
    grid = f"{'x'.join(map(str, summary['shape']))}, {summary['cells']} cells, {summary['layers']} layers"
    print(f"\ngrid {grid}, {summary['parameters']:,} parameters, "
          f"{summary['memory_bytes']:,} bytes of weights ({by_dtype})")
    return 0


# ----- net morph / morph-report -----------------------------------------------------------
def cmd_net_morph(args) -> int:
    from loomlab.core import save_network
    from loomlab.core.morph import morph_all, morph_layer

    net = load_net(args.network)
    reports = morph_all(net, args.dtype) if args.all else [morph_layer(net, args.layer, args.dtype)]
    save_network(net, args.output)
    if args.json:
        print(json.dumps([asdict(r) for r in reports], indent=2))
        return 0
    print_table(("index", "layer", "dtype", "scale", "bytes", "float32 bytes", "rel error", "cosine"),
                 [(str(r.index), f"{r.path or r.type}", r.dtype, f"{r.scale:.6g}", f"{r.native_bytes:,}",
                   f"{r.float32_bytes:,}", f"{r.rel_error:.3e}", f"{r.cosine:.6f}") for r in reports])
    print(f"\nsaved {args.output}")
    return 0


def cmd_net_morph_report(args) -> int:
    from loomlab.core.morph import dtype_sweep, probe_input

    # a fresh copy per dtype: the same weights each time, a build-schema file's too
    load = lambda: load_net(args.network, backend=args.backend, seed=args.seed)
    net = load()
    probe = _load_npy(args.input) if args.input else probe_input(net, args.seed)
    rows = dtype_sweep(load, probe, on_progress=progress)
    if args.json:
        print(json.dumps({"probe_shape": list(probe.shape), "rows": [asdict(r) for r in rows]}, indent=2))
        return 0
    print_table(("dtype", "bytes", "weight rel error", "output drift"),
                 [(r.dtype, f"{r.weight_bytes:,}", f"{r.rel_error:.3e}", f"{r.output_drift:.3e}")
                  for r in rows])
    return 0


# ----- net run ----------------------------------------------------------------------------
def cmd_net_run(args) -> int:
    from loomlab.core.io.atomic import write_atomic

    x = _read_input(args)
    net = load_net(args.network, backend=args.backend)
    y = net.backend.to_numpy(net.forward(x))
    if args.output:
        buf = io.BytesIO()
        np.save(buf, y)
        write_atomic(args.output, buf.getvalue())
    else:
        print(json.dumps(y.tolist()))
    return 0


def _read_input(args) -> np.ndarray:
    if args.input is not None:
        x = _load_npy(args.input)
    else:
        try:
            x = np.asarray(json.loads(args.input_json), dtype=np.float32)
        except (json.JSONDecodeError, ValueError, TypeError) as e:
            raise CliError(f"--input-json is not a numeric JSON array: {e}") from None
    if args.shape:
        try:
            shape = tuple(int(s) for s in args.shape.split(","))
        except ValueError:
            raise CliError(f"--shape must be integers separated by commas, got {args.shape!r}") from None
        if any(s <= 0 for s in shape) or int(np.prod(shape)) != x.size:
            raise CliError(f"--shape {args.shape} does not fit {x.size} values")
        x = x.reshape(shape)
    elif x.ndim <= 1:
        x = x.reshape(1, -1)  # Loom's forward(list) uses shape [1, len]
    return x


def _load_npy(path: str) -> np.ndarray:
    try:
        x = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise CliError(f"cannot read {path}: {e}") from None
    if x.dtype.kind not in "biuf":
        raise CliError(f"{path} must hold numbers, got dtype {x.dtype}")
    return x.astype(np.float32)


