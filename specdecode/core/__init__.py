"""The decoding core: the loop (engine.py) over a target adapter (target.py) and its KV cache, trees as data,
pure verifiers, sampling, penalties, structured outputs, the speculation-length policy, metrics, logprobs and
detokenisation, and the drafter Protocol the loop calls (drafting.py)."""
