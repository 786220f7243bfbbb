"""A pooled chi-square goodness-of-fit test of sampled outcomes against exact probabilities."""
from __future__ import annotations

from collections import Counter

import numpy as np
from scipy.stats import chisquare


def chi2_pvalue(samples: list, exact: dict, min_expected: float = 5.0) -> float:
    """samples: outcomes; exact: outcome -> probability (sums to 1). Bins with expected count < min_expected
    are pooled into one bin, so the asymptotic test is valid. Returns the p-value."""
    n = len(samples)
    counts = Counter(samples)
    unknown = set(counts) - set(exact)
    assert not unknown, f"sampled outcomes with zero target probability: {sorted(unknown)[:5]}"
    observed, expected = [], []
    pooled_obs, pooled_exp = 0.0, 0.0
    for outcome, prob in exact.items():
        if prob * n >= min_expected:
            observed.append(counts.get(outcome, 0))
            expected.append(prob * n)
        else:
            pooled_obs += counts.get(outcome, 0)
            pooled_exp += prob * n
    if pooled_exp > 0:
        observed.append(pooled_obs)
        expected.append(pooled_exp)
    expected_arr = np.array(expected)
    expected_arr *= sum(observed) / expected_arr.sum()
    return float(chisquare(observed, expected_arr).pvalue)
