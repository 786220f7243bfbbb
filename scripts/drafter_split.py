"""Our drafters side by side on the benchmark's prompts without transformers' baseline (which takes most of a
`specdecode bench` run of the Qwen pair on the CPU: 10 tokens/s in fp32): each turn decoded by every method in a
rotating order in one process, later turns after `none`'s answers, and where each method's seconds go by the
engine's own timers (prefill, drafting, verification; docs/drafters.md, "hybrid"), and each method's steps by kind
(free drafts, drafts that cost draft passes, none) from the steps' own outcomes.

    .venv/bin/python scripts/drafter_split.py --model qwen2.5-coder-1.5b --draft-model qwen2.5-coder-0.5b \
        --methods none,draft-model,hybrid --limit 2 --max-new-tokens 128
"""
from __future__ import annotations

import argparse
import statistics
import time
from collections import Counter, defaultdict

from specdecode.api import SpecDecoder
from specdecode.bench.methods import forgetting
from specdecode.bench.prompts import load_prompts, select
from specdecode.bench.runner import PHASES, encode_conversation
from specdecode.config import DrafterConfig, GenerationConfig, SamplingConfig, SpecConfig
from specdecode.drafters import get_spec


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--draft-model", default=None)
    parser.add_argument("--methods", default="none,draft-model,hybrid",
                        help="drafters, each NAME, NAME@K (its own speculation length) or either with +first (it "
                             "drafts in the first step too: SpecConfig.first_step_drafts); the first gives the history")
    parser.add_argument("--category", default=None, help="comma list (agentic runs only when named)")
    parser.add_argument("--limit", type=int, default=None, help="questions per category")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--k", type=int, default=5)
    args = parser.parse_args()
    names = args.methods.split(",")
    decoders = {name: _load(args.model, args.draft_model, name, args.k) for name in names}
    tokenizer = decoders[names[0]].tokenizer
    questions = select(load_prompts(None, tuple(args.category.split(",")) if args.category else None), args.limit)
    greedy = SamplingConfig()
    warm = encode_conversation(tokenizer, [{"role": "user", "content": questions[0].turns[0]}])
    for decoder in decoders.values():  # warm-up, then forget what it left (as bench does)
        decoder.engine.generate(warm, greedy, GenerationConfig(max_new_tokens=16))
        forgetting(decoder.engine)()
    sums: dict[tuple[str, str], Counter] = defaultdict(Counter)  # (category or "overall", method) -> sums
    same, turns = Counter(), 0
    firsts: dict[str, list[float]] = defaultdict(list)  # method -> seconds to each turn's first token
    steps: dict[tuple[str, str], Counter] = defaultdict(Counter)  # (method, kind of step) -> sums over its steps
    for question in questions:
        history: list[dict[str, str]] = []
        for text in question.turns:
            history.append({"role": "user", "content": text})
            prompt = encode_conversation(tokenizer, history)
            outputs = {}
            for name in names[turns % len(names):] + names[: turns % len(names)]:
                began, first, seq = time.perf_counter(), None, None
                generation = GenerationConfig(max_new_tokens=args.max_new_tokens)
                for seq, outcome in decoders[name].engine.stream(prompt, greedy, generation):  # noqa: B007 - read after
                    first = time.perf_counter() - began if first is None else first
                    kind = "free" if outcome.free else "paid" if outcome.depth else "undrafted"
                    steps[name, kind].update(steps=1, depth=outcome.depth, accepted=outcome.accepted,
                                             draft_s=outcome.draft_s, verify_s=outcome.verify_s)
                wall = time.perf_counter() - began
                m = seq.metrics
                firsts[name].append(first)
                for key in ((question.category, name), ("overall", name)):
                    sums[key].update(wall=wall, tokens=m.new_tokens, passes=m.target_passes,
                                     **{f: getattr(m, f) for f in PHASES})
                outputs[name] = seq.output_ids
            same.update(name for name in names if outputs[name] == outputs[names[0]])
            history.append({"role": "assistant", "content": tokenizer.decode(outputs[names[0]],
                                                                              skip_special_tokens=True)})
            turns += 1
    ratio = [f"{names[-1]} / {names[-2]}"] if len(names) > 1 else []
    print("| " + " | ".join(["category", *names, *ratio]) + " |\n|---|" + "---:|" * (len(names) + len(ratio)))
    for category in sorted({c for c, _ in sums}, key=lambda c: (c == "overall", c)):
        rates = [sums[(category, n)]["tokens"] / sums[(category, n)]["wall"] for n in names]
        last = f" {rates[-1] / rates[-2]:.2f}x |" if len(names) > 1 else ""
        print(f"| {category} | " + " | ".join(f"{r:.1f}" for r in rates) + " |" + last)
    for name in names:
        s = sums[("overall", name)]
        print(f"{name}: {s['tokens'] / s['wall']:.1f} tokens/s, tau {s['tokens'] / s['passes']:.2f}, wall "
              f"{s['wall']:.1f} s: prefill {s['prefill_s']:.1f}, drafting {s['draft_s']:.1f}, verifying "
              f"{s['verify_s']:.1f}; median time to first token {statistics.median(firsts[name]) * 1000:.0f} ms; "
              f"equal to {names[0]} on {same[name]}/{turns} turns")
        for kind in ("free", "paid", "undrafted"):  # paid: a draft that cost draft passes (a model's chain)
            c = steps[name, kind]
            if c["steps"]:
                n = c["steps"]
                print(f"  {kind} steps: {n}, depth {c['depth'] / n:.2f}, accepted {c['accepted'] / n:.2f}, drafting "
                      f"{c['draft_s'] / n * 1000:.1f} ms, verifying {c['verify_s'] / n * 1000:.1f} ms a step")


def _load(model: str | None, draft_model: str | None, method: str, k: int) -> SpecDecoder:
    """method: a drafter's name, or name@K for that drafter at speculation length K (several K in one run),
    either with +first: it drafts in the first step too."""
    method, first = method.removesuffix("+first"), method.endswith("+first")
    name, _, own_k = method.partition("@")
    draft = draft_model if get_spec(name).needs_draft_model else None
    spec = SpecConfig(k=int(own_k or k), first_step_drafts=first)
    return SpecDecoder.load(model, DrafterConfig(name, draft_model=draft), spec=spec)


if __name__ == "__main__":
    main()
