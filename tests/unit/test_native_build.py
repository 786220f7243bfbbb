"""The native kernels are built at install (setup.py): a process finds them without a compiler, and the portable
build (what a CPU without AVX2 runs) decodes losslessly when it is chosen."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from specdecode.backends.cpu import native
from specdecode.config import GenerationConfig, SamplingConfig, SpecConfig
from specdecode.core.engine import Engine
from specdecode.core.target import Target
from specdecode.loading.formats import apply
from tests.tiny import tiny_drafter, tiny_llama

ROOT = Path(__file__).resolve().parents[2]
PROMPT = [5, 9, 14, 5, 9, 14, 5, 9, 30, 31, 5, 9, 14, 5, 9]

pytestmark = pytest.mark.skipif(native.missing() is not None, reason=str(native.missing()))

# a packed tiny model decodes on the native path in a process with no compiler to reach
NO_COMPILER = """
import json, torch
from specdecode.backends.cpu import native
from specdecode.core.target import Target
from specdecode.loading.formats import apply
from tests.tiny import tiny_llama
model = tiny_llama()
apply(model, "int4")
target = Target(model)
logits = target.model(torch.tensor([[5, 9, 14]])).logits
finite = bool(logits.isfinite().all())
print(json.dumps({"native": target.packed_decoder, "variant": native.best_variant(), "finite": finite}))
"""


def test_nothing_is_compiled_at_run_time(tmp_path):
    """CC names a program that fails, PATH holds no compiler and the user cache is empty: the kernels still load
    (they were built at install) and a packed model runs its decoder layers natively."""
    env = {**os.environ, "CC": "/bin/false", "PATH": str(tmp_path), "SPECDECODE_CACHE": str(tmp_path / "cache"),
           "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", NO_COMPILER], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen == {"native": True, "variant": native.best_variant(), "finite": True}
    assert not (tmp_path / "cache").exists()  # nothing written to the cache either


def _decode(name: str) -> tuple[list[int], int]:
    """40 greedy tokens of a packed tiny model -> (tokens, draft tokens proposed)."""
    model = tiny_llama(seed=4)
    apply(model, "int4")
    target = Target(model)
    assert target.packed_decoder
    spec = SpecConfig(k=4)
    engine = Engine(target, tiny_drafter(target, name, spec, row_cost=0.0), spec)  # drafts asserted
    result = engine.generate(PROMPT, SamplingConfig(), GenerationConfig(max_new_tokens=40, stop_on_eos=False))
    return result.token_ids, result.metrics.proposed


@pytest.mark.parametrize("variant", ["portable", "avx2"])
def test_a_forced_variant_decodes_losslessly(variant, monkeypatch):
    """SPECDECODE_KERNELS=portable runs the whole decoder on the portable build (as a CPU without AVX2 does): its
    prompt-lookup output equals its plain greedy output token for token."""
    reason = native.lacking(variant)
    if reason:
        pytest.skip(reason)
    monkeypatch.setenv(native.CHOICE, variant)
    native._best_index.cache_clear()
    try:
        assert native.variant_index() == native.built().index(variant)
        plain, _ = _decode("none")
        speculative, proposed = _decode("prompt-lookup")
        assert speculative == plain and proposed > 0
    finally:
        monkeypatch.delenv(native.CHOICE)
        native._best_index.cache_clear()


def test_the_kernels_load_without_the_library_behind_them():
    """Importing the package, then loading the kernels, imports torch and the extension only: not transformers
    or the engine (the package's names load on first use), so a first import costs torch's import and little
    more. Checked by what is imported, not by a time."""
    script = ("import sys, specdecode\n"
              "assert 'torch' not in sys.modules\n"
              "from specdecode.backends.cpu import native\n"
              "native.ops()\n"
              "assert not [m for m in sys.modules if m.split('.')[0] == 'transformers' or m == 'specdecode.api']\n"
              "from specdecode import SpecDecoder\n"
              "assert 'transformers' in sys.modules\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
