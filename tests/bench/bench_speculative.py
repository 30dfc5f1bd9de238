"""Benchmark: speculative greedy decoding against plain greedy decoding on SmolLM2-135M.

    python tests/bench/bench_speculative.py [--max-tokens 128] [--rounds 2] [--exact] [--prompts a,b]

Six chat prompts: two open ones (a story, advice) where nothing repeats the prompt, and four
that work from a text in the prompt (summarise a paragraph, summarise another, list the action
items of meeting notes, answer a question about the paragraph), where prompt lookup can copy.
Ways: plain; prompt lookup (no second model) as by default (2- and 3-grams, up to 2 tokens per
matched token, 6 at most), as before 2026-11-28 (3-grams, 3 tokens) and with n-grams down to 1;
a draft model (a Q4_0 morph of the same model, 4 or 2 tokens a step). Every speculative output
is checked equal to the plain one first. Decode tokens/s is the best of ``rounds`` runs;
speed-up is over plain decode; acceptance is accepted / drafted tokens. Prints JSON.
"""

from __future__ import annotations

import argparse
import json

from loomlab.core.llm import load_model
from loomlab.core.llm.generate.speculative import DraftModel, PromptLookup
from loomlab.core.llm.quality.recipe import apply_recipe
from loomlab.core.procinfo import machine

PARAGRAPH = ("The river Loom rises in the northern hills and runs for two hundred kilometres to the "
             "sea. Its valley was settled by weavers in the twelfth century, who used the fast water "
             "to drive their looms. By the nineteenth century the town of Loomford had forty mills, "
             "and the river carried cloth to the port on flat-bottomed barges. The last mill closed "
             "in 1968; today the valley is known for its walking trails and its museum of weaving.")
PHOTOSYNTHESIS = ("Photosynthesis is the process by which green plants, algae and some bacteria turn "
                  "light into chemical energy. In the chloroplasts, chlorophyll absorbs red and blue "
                  "light; the energy splits water into oxygen, protons and electrons. The electrons "
                  "drive the synthesis of ATP and NADPH, which the Calvin cycle then uses to fix carbon "
                  "dioxide into sugars. Almost all the oxygen in the atmosphere comes from "
                  "photosynthesis, and almost all food chains begin with it.")
NOTES = ("Meeting notes, 14 March. Present: Ana, Ben, Chloe. Ana reported that the new build server is "
         "ready and that nightly builds will start on Monday. Ben said the release is delayed by one "
         "week because two tests fail on Windows. Chloe will write the migration guide for version 3 "
         "and send it for review by Friday. Next meeting: 21 March at 10:00.")


def _user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


PROMPTS = {
    "chat": _user("Write a short story about a lighthouse keeper."),
    "chat-advice": _user("What are three good habits for learning a new language?"),
    "summarise": _user(PARAGRAPH + "\n\nSummarise the text above."),
    "summarise-2": _user(PHOTOSYNTHESIS + "\n\nSummarise the text above."),
    "action-items": _user(NOTES + "\n\nList the action items from these notes."),
    "question": _user(PARAGRAPH + "\n\nWhen did the last mill close, and what is the valley known for "
                      "today?"),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--exact", action="store_true", help="the exact path (default: int8 activations)")
    ap.add_argument("--prompts", default=",".join(PROMPTS), help="comma-separated: " + ", ".join(PROMPTS))
    args = ap.parse_args()
    names = args.prompts.split(",")
    unknown = sorted(set(names) - set(PROMPTS))
    if unknown:
        ap.error(f"unknown prompts: {', '.join(unknown)}")
    model = load_model("smollm2-135m")
    draft = load_model("smollm2-135m")
    apply_recipe(draft.net, "Q4_0")
    model.activations = draft.activations = "float32" if args.exact else "int8"
    ways = {"plain": None, "prompt-lookup": PromptLookup(),
            "prompt-lookup-3gram-k3": PromptLookup(num_draft=3, min_ngram=3),
            "prompt-lookup-n3..1": PromptLookup(min_ngram=1),
            "draft-model-q4_0-k4": DraftModel(draft, num_draft=4),
            "draft-model-q4_0-k2": DraftModel(draft, num_draft=2)}
    rows = []
    for name in names:
        messages = PROMPTS[name]
        plain_ids, plain_tps = None, 0.0
        for way, drafter in ways.items():
            best, ids = None, None
            for _ in range(args.rounds):
                ids = [r.id for r in model.chat(messages, max_tokens=args.max_tokens, speculative=drafter)]
                m = model.metrics()
                if best is None or m.decode_tokens_per_s > best.decode_tokens_per_s:
                    best = m
            if plain_ids is None:
                plain_ids, plain_tps = ids, best.decode_tokens_per_s
            rows.append({"prompt": name, "way": way, "tokens": len(ids), "same_as_plain": ids == plain_ids,
                         "decode_tokens_per_s": round(best.decode_tokens_per_s, 1),
                         "speed_up": round(best.decode_tokens_per_s / plain_tps, 2),
                         "drafted": best.drafted_tokens, "accepted": best.accepted_tokens,
                         "acceptance_rate": round(best.acceptance_rate, 3)})
            print(json.dumps(rows[-1]), flush=True)
    print(json.dumps({"machine": machine(), "max_tokens": args.max_tokens, "activations": model.activations,
                      "results": rows}, indent=1))


if __name__ == "__main__":
    main()
