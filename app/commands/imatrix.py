"""``loomlab imatrix``: llama.cpp's ``llama-imatrix`` (no Qt).

The per-column input statistics of every block matrix over a text (core/llm/quality/imatrix.py),
written as llama-imatrix writes them (GGUF, or the legacy ``.dat`` with ``--output-format dat``)
for ``llama-quantize --imatrix``. Ctrl-C stops it; the output file is written only at the end,
and atomically, so a cancelled run leaves nothing behind.
"""

from __future__ import annotations

import json
import sys

from ..cli import CliError, add_backend_option, progress, progress_bar


def register(sub) -> None:
    p = sub.add_parser("imatrix", help="an importance matrix of a language model over a text (llama-imatrix)",
                       description="Collect llama-imatrix's statistics (each matrix's input, squared and "
                                   "summed per column) over a text, on the exact path (float32 activations).")
    p.add_argument("model", help="a built-in alias (smollm2-135m, gemma3-270m), a .gguf file or an HF folder")
    p.add_argument("--text", required=True, metavar="FILE",
                   help="the calibration text (UTF-8); at least 2 × ctx tokens")
    p.add_argument("-o", "--output", required=True, metavar="OUT", help="the file to write")
    p.add_argument("--ctx", type=int, default=512, help="tokens per chunk (default 512, llama.cpp's)")
    p.add_argument("--chunks", type=int, default=None, help="at most this many chunks (default: all)")
    p.add_argument("--output-format", choices=("gguf", "dat"), default="gguf",
                   help="gguf (default, llama.cpp's current format) or dat (the legacy one)")
    p.add_argument("--process-output", action="store_true",
                   help="also collect the LM head's input (output.weight; not a head tied to token_embd)")
    p.add_argument("--json", action="store_true", help="print a summary as one JSON object")
    add_backend_option(p)
    p.set_defaults(handler=cmd_imatrix)


def cmd_imatrix(args) -> int:
    from loomlab.core.io.atomic import destination
    from loomlab.core.io.bounded_read import read_small_text
    from loomlab.core.llm.generate.textmodel import load_model
    from loomlab.core.llm.quality.imatrix import compute_imatrix, imatrix_summary, write_imatrix

    if args.ctx < 1 or (args.chunks is not None and args.chunks < 1):
        raise CliError("--ctx and --chunks must be at least 1")
    destination(args.output)  # a device, FIFO or folder is refused before the model loads
    text = read_small_text(args.text, "the text file", limit=256 * 1024 * 1024)
    if not args.output.endswith(".gguf") and args.output_format == "gguf":
        print("loomlab: note: writing GGUF to a name without .gguf (--output-format dat for the legacy "
              "format)", file=sys.stderr)
    with load_model(args.model, progress=progress_bar, backend=args.backend) as model:
        im = compute_imatrix(model, text, ctx=args.ctx, chunks=args.chunks, dataset=args.text,
                             process_output=args.process_output,
                             progress=lambda done, total: progress(done, total, "chunks"))
        name = model.name
    path = write_imatrix(im, args.output, output_format=args.output_format)
    summary = {"model": name, "path": str(path), "format": args.output_format, **imatrix_summary(im)}
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        from loomlab.core.units import format_count

        print(f"{path}: {summary['tensors']} tensors, {format_count(im.chunk_count, 'chunk')} of "
              f"{im.chunk_size} tokens")
    return 0
