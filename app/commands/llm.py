"""``loomlab generate | chat | tokenize | bench``: language models from the terminal (no Qt)."""

from __future__ import annotations

import json
import re
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

from ..cli import (
    CliError,
    add_activations_option,
    add_backend_option,
    add_speculative_option,
    progress_bar,
    token_ids,
)

#: Exit status of a command whose constrained output was cut by --max-tokens: it does not match.
EXIT_CUT = 1
# A line of the interactive chat that is a command, not a message: a slash and one word.
_COMMAND = re.compile(r"/\w+")


def register(sub) -> None:
    gen = sub.add_parser("generate", help="continue a prompt with a language model")
    _model_arg(gen)
    src = gen.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="prompt text")
    src.add_argument("--ids", help="prompt token ids, e.g. 1,2,3")
    add_activations_option(gen)
    _sampling_args(gen)
    _constraint_args(gen)
    gen.set_defaults(handler=cmd_generate)

    chat = sub.add_parser("chat", help="talk with a language model (interactive, or one --message)",
                          description="Talk with a chat model. Interactive commands: " +
                          "; ".join(f"{usage} {what}" for usage, (_, what) in CHAT_COMMANDS.items()) +
                          "; a message that starts with / is sent as //message.")
    _model_arg(chat)
    chat.add_argument("--message", help="send one message, print the reply and exit")
    chat.add_argument("--system", help="system prompt")
    chat.add_argument("--drop-oldest", action="store_true",
                      help="when the conversation outgrows the context, drop the oldest turns")
    chat.add_argument("--save", action="store_true",
                      help="keep the conversation in the workspace, where the window lists it")
    add_activations_option(chat)
    _sampling_args(chat)
    _constraint_args(chat, "every reply")
    chat.set_defaults(handler=cmd_chat)

    tok = sub.add_parser("tokenize", help="show the token ids of a text")
    _model_arg(tok)
    tok.add_argument("text")
    tok.add_argument("--special", action="store_true", help="add the model's BOS/EOS")
    tok.add_argument("--json", action="store_true")
    tok.set_defaults(handler=cmd_tokenize)

    bench = sub.add_parser("bench", help="measure prefill and decode speed")
    _model_arg(bench)
    bench.add_argument("--tokens", type=int, default=64, help="tokens to decode (default 64)")
    bench.add_argument("--repeat", type=int, default=3, help="runs; the best is reported (default 3)")
    bench.add_argument("--json", action="store_true")
    add_activations_option(bench)
    add_speculative_option(bench)
    bench.set_defaults(handler=cmd_bench)


def _model_arg(p) -> None:
    p.add_argument("model", help="a built-in alias (smollm2-135m, gemma3-270m), a .gguf file or an HF folder")
    add_backend_option(p)


def _sampling_args(p) -> None:
    g = p.add_argument_group("sampling")
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--min-p", type=float, default=0.0)
    g.add_argument("--repetition-penalty", type=float, default=1.0)
    g.add_argument("--presence-penalty", type=float, default=0.0)
    g.add_argument("--frequency-penalty", type=float, default=0.0)
    g.add_argument("--seed", type=int)
    g.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    g.add_argument("--max-tokens", type=int, default=256)
    g.add_argument("--json", action="store_true", help="print one JSON object per token, then a summary")


def _constraint_args(p, what: str = "output") -> None:
    shape = p.add_argument_group("constrained output").add_mutually_exclusive_group()
    shape.add_argument("--json-schema", metavar="FILE", help=f"{what} must be JSON valid against this schema")
    shape.add_argument("--regex", metavar="PATTERN", help=f"{what} must match this regular expression")


def _sampling(args) -> dict:
    return dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                repetition_penalty=args.repetition_penalty, presence_penalty=args.presence_penalty,
                frequency_penalty=args.frequency_penalty, seed=args.seed, stop=tuple(args.stop),
                max_tokens=args.max_tokens, logprobs=5 if args.json else 0)


def _response_format(args) -> dict | None:
    """``--json-schema`` / ``--regex`` as a response_format, checked before the model loads."""
    from loomlab.core.llm.generate.constrain import grammar_of

    if args.regex is not None:
        fmt = {"type": "regex", "pattern": args.regex}
    elif args.json_schema is not None:
        try:
            schema = json.loads(Path(args.json_schema).read_text())
        except (OSError, ValueError) as e:
            raise CliError(f"--json-schema {args.json_schema}: {e}") from None
        fmt = {"type": "json_schema", "json_schema": schema}
    else:
        return None
    grammar_of(fmt)
    return fmt


@contextmanager
def _load(args, first_run: str | None = None):
    """The model of ``args``, closed after the block. On a first run (kernels not in numba's
    cache) the model answers on numpy while they compile, which is said (``first_run`` as
    ``load_model`` takes it: None is its default); a command that ends before they are ready
    finishes them, with progress (Ctrl-C stops: the next run goes on)."""
    from loomlab.core.llm.generate.textmodel import load_model
    from loomlab.core.llm.kernels.kernel_warmup import KERNELS_STAGE

    with load_model(args.model, progress=progress_bar, backend=args.backend, first_run=first_run,
                    activations=getattr(args, "activations", "int8")) as model:
        if not model.kernels_ready:
            print(f"loomlab: {KERNELS_STAGE}, in the background; until they are ready the model answers "
                  "on numpy (slower)", file=sys.stderr, flush=True)
        yield model
        if not model.kernels_ready:
            print("loomlab: finishing the kernels (Ctrl-C stops them; the next run goes on)",
                  file=sys.stderr, flush=True)
            model.wait_for_kernels(progress=progress_bar)


def _emit(records, as_json: bool) -> list:
    """Print a stream of TokenRecords as they come; returns them."""
    out = []
    for r in records:
        out.append(r)
        if as_json:
            print(json.dumps(asdict(r)), flush=True)
        else:
            print(r.text, end="", flush=True)
    return out


def _summary(m, records, finish: str | None, as_json: bool, backend: str) -> None:
    if as_json:
        print(json.dumps({"finish_reason": finish, "text": "".join(r.text for r in records),
                          "ids": [r.id for r in records if r.id >= 0], "backend": backend,
                          **_metrics_dict(m)}))
    else:
        print(f"[{m.generated_tokens} tokens, {m.decode_tokens_per_s:.1f} tok/s, "
              f"first token {m.time_to_first_token_s * 1000:.0f} ms, finish: {finish}, backend: {backend}]",
              file=sys.stderr)


def _metrics_dict(m) -> dict:
    return {**asdict(m), "prefill_tokens_per_s": m.prefill_tokens_per_s,
            "decode_tokens_per_s": m.decode_tokens_per_s}


def cmd_generate(args) -> int:
    response_format = _response_format(args)
    sampling = {**_sampling(args), "response_format": response_format}
    prompt = args.prompt if args.prompt is not None else token_ids(args.ids)
    with _load(args) as model:
        records = _emit(model.generate(prompt, **sampling), args.json)
        if not args.json:
            print()
        finish = records[-1].finish_reason if records else None
        _summary(model.metrics(), records, finish, args.json, model.backend.name)
    return EXIT_CUT if _cut(finish, response_format, args) else 0


def _cut(finish: str | None, response_format: dict | None, args) -> bool:
    """Whether a constrained output was cut by --max-tokens (said on stderr): it does not match."""
    if response_format is None or finish != "length":
        return False
    option = "--regex" if args.regex is not None else "--json-schema"
    print(f"loomlab: warning: the output was cut at --max-tokens {args.max_tokens} before it completed "
          f"the {option} format, so it does not match it; raise --max-tokens, or bound the format "
          "(a schema's maxLength, maximum, maxItems)", file=sys.stderr)
    return True


def cmd_chat(args) -> int:
    """A conversation through the same ChatSession the window uses. It is kept in memory only,
    unless ``--save`` keeps it in the user's workspace (where the window lists it)."""
    from loomlab.core.workspace.chat import ChatSession

    sampling = _sampling(args)
    logprobs = sampling.pop("logprobs")
    response_format = _response_format(args)
    if response_format is not None:
        sampling["response_format"] = response_format
    if args.drop_oldest:
        sampling["context_policy"] = "drop_oldest"
    with _load(args) as model:
        if not model.supports_chat:  # as the window, which offers such a model its Completion tab only
            raise CliError(f"{model.name} is a base model without a chat template: it continues text rather "
                           f"than answering messages; use `loomlab generate {args.model} --prompt TEXT`")
        with _chat_workspace(args.save) as workspace:
            session = ChatSession(workspace, model, logprobs=logprobs)
            session.set_system_prompt(args.system or "")
            session.set_sampling(sampling)
            if args.message is not None:
                finish = _chat_turn(session, args.message, args.json)
                return EXIT_CUT if _cut(finish, response_format, args) else 0
            return _chat_loop(session, args, response_format)


def _chat_loop(session, args, response_format: dict | None) -> int:
    """Messages and commands from stdin until it ends or /quit; exit status as for one message."""
    interactive = sys.stdin.isatty()
    if interactive:
        print("chat with the model; /help lists the commands, Ctrl-D quits, Ctrl-C stops a reply",
              file=sys.stderr)
    cut = False
    while True:
        try:
            # the prompt goes to stderr, so stdout holds only the replies (also when piped)
            line = input("> " if interactive else "").strip()
        except EOFError:
            if interactive:
                print(file=sys.stderr)
            break
        command, _, rest = line.partition(" ")
        if _COMMAND.fullmatch(command):
            handler = CHAT_COMMANDS.get(command, (_unknown_command, ""))[0]
            if handler(session, rest.strip(), command) is _QUIT:
                break
        elif line:
            message = line[1:] if line.startswith("//") else line
            cut |= _cut(_chat_turn(session, message, args.json), response_format, args)
    return EXIT_CUT if cut else 0


_QUIT = object()


def _help(session, rest: str, command: str) -> None:
    for usage, (_, what) in CHAT_COMMANDS.items():
        print(f"  {usage:<14} {what}", file=sys.stderr)
    print("  //TEXT         send TEXT that begins with /", file=sys.stderr)


def _reset(session, rest: str, command: str) -> None:
    session.close_conversation()
    kept = f'kept: "{session.system_prompt}"' if session.system_prompt else "none set"
    print(f"[new conversation; system prompt {kept}]", file=sys.stderr)


def _system(session, rest: str, command: str) -> None:
    session.set_system_prompt(rest)
    print(f'[system prompt: "{rest}"]' if rest else "[system prompt cleared]", file=sys.stderr)


def _quit(session, rest: str, command: str) -> object:
    return _QUIT


def _unknown_command(session, rest: str, command: str) -> None:
    print(f"[unknown command {command}; /help lists the commands]", file=sys.stderr)


#: The interactive chat's commands: usage -> (handler, what it does). A line that is a slash and a
#: word is a command, never a message for the model.
CHAT_COMMANDS = {
    "/help": (_help, "list these commands"),
    "/reset": (_reset, "start a new conversation (the system prompt stays)"),
    "/system": (_system, "TEXT: set the system prompt (none: clear it)"),
    "/quit": (_quit, "leave (so does Ctrl-D)"),
}


@contextmanager
def _chat_workspace(save: bool):
    """The user's workspace, or one in memory: nothing of the conversation reaches a disk, however
    the process ends."""
    from loomlab.core.workspace.store import IN_MEMORY, Workspace, default_path

    with Workspace(default_path() if save else IN_MEMORY) as workspace:
        yield workspace


def _chat_turn(session, text: str, as_json: bool) -> str | None:
    """Send one message and print the reply as it streams; Ctrl-C stops it (the part written is kept).
    Returns how the reply finished."""
    from loomlab.core.errors import LoomError

    try:
        reply = session.send(text)
    except LoomError as exc:
        raise CliError(str(exc)) from None
    tokens = reply.stream()
    try:
        records = _emit(tokens, as_json)
    except KeyboardInterrupt:
        tokens.close()
        records = reply.records
    if not as_json:
        print(flush=True)  # the reply's line ends, however it ended
    _summary(reply.metrics, records, reply.finish_reason, as_json, session.model.backend.name)
    return reply.finish_reason


def cmd_tokenize(args) -> int:
    with _load(args) as model:
        ids = model.tokenizer.encode(args.text, add_special_tokens=args.special)
        pieces = [model.tokenizer.id_to_token(i) for i in ids]
    if args.json:
        print(json.dumps({"ids": ids, "tokens": pieces}))
    else:
        print(" ".join(map(str, ids)))
        print(" ".join(repr(p) for p in pieces))
    return 0


BENCH_PROMPT = ("The history of computing is a story of people and machines: from mechanical calculators "
                "and punched cards to transistors, integrated circuits and the networks that")


def cmd_bench(args) -> int:
    import platform

    import numba

    from loomlab.core.llm.kernels.quant import thread_chooser
    from loomlab.core.procinfo import machine

    if args.tokens < 1 or args.repeat < 1:
        raise CliError("--tokens and --repeat must be >= 1")
    from loomlab.core.llm.generate.prefix_cache import PrefixCache

    with _load(args, first_run="wait") as model:  # the kernels are what it measures
        model.prefix_cache = PrefixCache(0)  # every run prefills the whole prompt
        list(model.generate(BENCH_PROMPT, max_tokens=2, speculative=args.speculative))  # warm-up: JIT, caches
        best = None
        for _ in range(args.repeat):
            t = time.perf_counter()
            threads = set()  # the kernels' thread counts seen between tokens (they follow the load)
            records = []
            for record in model.generate(BENCH_PROMPT, max_tokens=args.tokens, speculative=args.speculative):
                records.append(record)
                threads.add(numba.get_num_threads())
            m = model.metrics()
            run = {"prompt_tokens": m.prompt_tokens, "generated_tokens": len(records),
                   "prefill_tokens_per_s": round(m.prefill_tokens_per_s, 1),
                   "decode_tokens_per_s": round(m.decode_tokens_per_s, 1),
                   "time_to_first_token_ms": round(m.time_to_first_token_s * 1000, 1),
                   "drafted_tokens": m.drafted_tokens, "accepted_tokens": m.accepted_tokens,
                   "wall_s": round(time.perf_counter() - t, 3),
                   "kernel_threads": sorted(threads),
                   "others_busy_cores": round(thread_chooser.others, 2) if thread_chooser else None}
            if best is None or run["decode_tokens_per_s"] > best["decode_tokens_per_s"]:
                best = run
        m = model.metrics()
        best["peak_rss_mib"] = round(m.peak_rss_bytes / 2**20, 1)
        best["activations"] = model.activations
        best["speculative"] = args.speculative or "off"
        best["backend"] = model.backend.name
    result = {"model": args.model, "machine": machine(), "python": platform.python_version(),
              "numba_threads": numba.get_num_threads(), **best}
    memory = m.device_memory  # None on numpy, which has no device
    if args.json:
        print(json.dumps({**result, "device_memory": None if memory is None else asdict(memory)}, indent=2))
    else:
        described = f"none ({model.backend.name})" if memory is None else memory.describe()
        for k, v in {**result, "device_memory": described}.items():
            print(f"{k:<24} {v}")
    return 0


