"""Verifiers: pure functions of draft tokens, draft probabilities and target scores (no model, no cache)."""
from .greedy import verify_greedy
from .tree import Verdict, verify_sampling

__all__ = ["Verdict", "verify_greedy", "verify_sampling"]
