"""Loading on a thread that ends (backends/cpu/own_thread.py): the result or the error comes back to the caller,
and the library and the server load that way on the CPU, so the decoding thread owns the only OpenMP team."""
from __future__ import annotations

import threading

import pytest

from specdecode import api
from specdecode.backends.cpu.own_thread import run_in_own_thread
from specdecode.errors import ConfigError


def test_runs_elsewhere_and_returns_or_raises():
    caller = threading.get_ident()
    assert run_in_own_thread(lambda a, b=0: (threading.get_ident(), a + b), 2, b=3)[1] == 5
    assert run_in_own_thread(threading.get_ident) != caller

    def fail():
        raise ConfigError("bad flag")

    with pytest.raises(ConfigError, match="bad flag"):
        run_in_own_thread(fail)


def test_the_library_loads_on_a_thread_that_has_ended(tiny_model_dir, monkeypatch):
    loaders = []
    real = api.load_model

    def spy(*args, **kwargs):
        loaders.append(threading.current_thread())
        return real(*args, **kwargs)

    monkeypatch.setattr(api, "load_model", spy)
    decoder = api.SpecDecoder.load(tiny_model_dir, "prompt-lookup")
    [loader] = loaders
    assert loader is not threading.current_thread() and not loader.is_alive()
    assert len(decoder.generate("the cat", max_new_tokens=4).token_ids) == 4


def test_the_server_loads_on_a_thread_that_has_ended(monkeypatch):
    from specdecode.server import service

    seen = []
    monkeypatch.setattr(service, "_build_service", lambda config: seen.append(threading.current_thread()))
    service.build_service(service.ServeConfig())
    [loader] = seen
    assert loader is not threading.current_thread() and not loader.is_alive()
