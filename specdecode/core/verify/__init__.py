"""Verifiers: pure functions of draft tokens, draft probabilities and target scores (no model, no cache)."""
from specdecode.core.verify.greedy import verify_greedy
from specdecode.core.verify.rows import verify_rows
from specdecode.core.verify.tree import Verdict, verify_sampling

__all__ = ["Verdict", "verify_greedy", "verify_rows", "verify_sampling"]
