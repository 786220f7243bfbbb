"""How far drafting by copying earlier text could go on a benchmark category, with hindsight.

Decodes every turn of the category greedily with plain decoding (turns asked in file order, a later turn after
the earlier answers, as `specdecode bench` asks them), then replays each answer: at every step it drafts the
longest run of the true continuation found right after any earlier occurrence of the last `n` tokens (this
prompt, this answer so far, and every earlier prompt and answer), at most k tokens. No drafter can choose that
well without knowing the answer, so its tau bounds what prompt lookup and suffix decoding can reach here.

    .venv/bin/python scripts/copy_oracle.py --category agentic --k 5,16
"""
from __future__ import annotations

import argparse

from specdecode.api import SpecDecoder
from specdecode.bench.prompts import load_prompts
from specdecode.bench.runner import encode_conversation
from specdecode.config import GenerationConfig


def answers(category: str, max_new_tokens: int) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, greedy answer ids) of every turn of the category, in order."""
    decoder = SpecDecoder.load(drafter="none")
    turns = []
    for question in load_prompts(None, (category,)):
        history: list[dict[str, str]] = []
        for text in question.turns:
            history.append({"role": "user", "content": text})
            prompt = encode_conversation(decoder.tokenizer, history)
            result = decoder.engine.generate(prompt, None, GenerationConfig(max_new_tokens=max_new_tokens))
            turns.append((prompt, result.token_ids))
            history.append({"role": "assistant", "content": decoder.tokenizer.decode(result.token_ids,
                                                                                      skip_special_tokens=True)})
    return turns


def oracle_tau(turns: list[tuple[list[int], list[int]]], k: int, n: int = 1) -> float:
    """Tokens per target pass when every step drafts the best copy it could have found (module docstring)."""
    earlier: list[int] = []
    steps = tokens = 0
    for prompt, answer in turns:
        i = 0
        while i < len(answer):
            context = earlier + [-1] + prompt + answer[:i]
            key, best = context[-n:], 0
            for p in range(len(context) - n):
                if context[p : p + n] != key:
                    continue
                run = 0
                while (run < k and i + run < len(answer) - 1 and p + n + run < len(context)
                       and context[p + n + run] == answer[i + run]):
                    run += 1
                best = max(best, run)
            i += best + 1
            steps += 1
        tokens += len(answer)
        earlier += [-1] + prompt + answer
    return tokens / max(steps, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--category", default="agentic")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--k", default="5,16", help="comma list of draft lengths")
    parser.add_argument("--n", type=int, default=1, help="tokens the copy's occurrence must match")
    args = parser.parse_args()
    turns = answers(args.category, args.max_new_tokens)
    print(f"{len(turns)} turns, {sum(len(a) for _, a in turns)} answer tokens")
    for k in (int(value) for value in args.k.split(",")):
        print(f"k {k}: oracle tau {oracle_tau(turns, k, args.n):.2f}")


if __name__ == "__main__":
    main()
