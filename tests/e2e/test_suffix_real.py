"""The suffix drafter on the real default model: three requests with the same JSON extraction instructions over
different texts. Each later request drafts from the earlier answers in the store, at a higher tau than the first,
and every answer is still the plain greedy one."""
from __future__ import annotations

import pytest

from specdecode.config import DrafterConfig, GenerationConfig, SamplingConfig, SpecConfig
from specdecode.core.engine import Engine
from specdecode.drafters import build_drafter
from tests.e2e.server_util import chat_ids

pytestmark = pytest.mark.slow

INSTRUCTIONS = ('Extract the person as JSON with keys "name", "age", "city" and "job". Answer with the JSON object '
                'only.\n\nText: ')
TEXTS = ["Maria Lopez, 34, works as a nurse in Madrid.", "Tom Becker is a 52-year-old carpenter living in Hamburg.",
         "Aiko Tanaka (28) is a software engineer from Osaka."]


def test_later_requests_draft_from_earlier_answers(default_target):
    spec = SpecConfig(k=5, pause_on_time=False)  # tau is asserted: K must not depend on the machine's timing,
    config = DrafterConfig("suffix", row_cost=0.14)  # nor the draft on a row cost measured on a busy machine
    engine = Engine(default_target, build_drafter(default_target, config, spec), spec)
    plain = Engine(default_target, build_drafter(default_target, DrafterConfig("none"), spec), spec)
    generation = GenerationConfig(max_new_tokens=64)
    results = []
    for text in TEXTS:
        ids = chat_ids(default_target.tokenizer, INSTRUCTIONS + text)
        results.append(engine.generate(ids, SamplingConfig(), generation))
        assert results[-1].token_ids == plain.generate(ids, SamplingConfig(), generation).token_ids
    taus = [r.metrics.tau for r in results]
    assert engine.drafter.stats().sequences == 3 and engine.drafter.stats().hits > 0
    assert min(taus[1:]) > taus[0] + 0.3, taus
