"""Model drafters (draft-model, layer-skip) report q = the distribution their token was actually drawn from
(model_step.choose). Verification is exact only then; the end-to-end tests run at temperature 0.9, where a q
that forgot the temperature or top-k/top-p is close enough to pass, so this checks q directly: sampled tokens
follow the reported q (chi-square), q is the sampling transform of the target-vocabulary logits, and the same
test rejects the untransformed softmax."""
from __future__ import annotations

import pytest
import torch

from specdecode.config import SamplingConfig
from specdecode.core.sampling import probabilities
from specdecode.drafters.common.model_step import choose
from tests.stats.chi2 import chi2_pvalue

VOCAB = 12  # target vocabulary; the draft's logits have two extra columns that must never be drawn
DRAWS = 4000
CONFIGS = [SamplingConfig(temperature=0.5), SamplingConfig(temperature=2.0, top_k=4),
           SamplingConfig(temperature=1.5, top_p=0.8)]


@pytest.mark.parametrize("sampling", CONFIGS, ids=["t0.5", "t2-topk4", "t1.5-topp0.8"])
def test_choose_reports_the_distribution_it_draws_from(sampling):
    logits = 2.0 * torch.randn(VOCAB + 2, generator=torch.Generator().manual_seed(4))  # [draft_vocab]
    logits[VOCAB:] = 10.0  # draft-only tokens, very likely if they were not cut off
    generator = torch.Generator().manual_seed(0)
    draws, q = [], None
    for _ in range(DRAWS):
        token, q, top = choose(logits, sampling, generator, VOCAB)
        draws.append(token)
    expected = probabilities(logits[:VOCAB], sampling)  # [VOCAB]
    assert q.shape == (VOCAB,) and torch.allclose(q, expected)
    assert top == pytest.approx(float(expected.max()))
    reported = {t: float(q[t]) for t in range(VOCAB) if q[t] > 0}
    assert len(reported) >= 3, "the test needs a spread-out q"
    assert chi2_pvalue(draws, reported) > 1e-3
    plain = logits[:VOCAB].float().softmax(-1)  # a q that forgot the transform: the same test must reject it
    assert chi2_pvalue(draws, {t: float(plain[t]) for t in range(VOCAB)}) < 1e-6
