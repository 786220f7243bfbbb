"""Not a test (run by hand): `specdecode bench` plus a `specdecode-<drafter>-notime` method for every drafter,
the same drafter with SpecConfig.pause_on_time off, so the time-based pause is measured on and off
interleaved in ONE bench run (this machine's load changes from minute to minute; ratios across runs mislead).

    .venv/bin/python scripts/bench_time_pause.py bench --prompts SUBSET.jsonl \
        --methods specdecode-none,specdecode-lookahead,specdecode-lookahead-notime --out /tmp/bench-la --no-progress

Takes the arguments of `specdecode` itself. Greedy acceptance does not depend on timing, so a -notime method's
tau is the tau of the acceptance rule alone (a check that the switch took)."""
from __future__ import annotations

import dataclasses
import sys

import specdecode.bench.methods as methods
import specdecode.drafters as drafters
from specdecode.cli.main import main
from specdecode.core.engine import Engine
from specdecode.drafters.common.base import DrafterSpec


def _notime(spec: DrafterSpec) -> DrafterSpec:
    def build(target, config, spec_config):
        drafter = spec.build(target, dataclasses.replace(config, name=spec.name), spec_config)
        drafter.time_pause_off = True
        return drafter

    return dataclasses.replace(spec, name=f"{spec.name}-notime", build=build)


def _engine(target, drafter, spec, max_batch=1):
    if getattr(drafter, "time_pause_off", False):
        spec = dataclasses.replace(spec, pause_on_time=False)
    return Engine(target, drafter, spec, max_batch=max_batch)


if __name__ == "__main__":
    drafters._SPECS = drafters._SPECS + tuple(_notime(s) for s in drafters._SPECS if s.name != "none")
    methods.Engine = _engine  # the bench builds its engines here
    sys.exit(main(sys.argv[1:]))
