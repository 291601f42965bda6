"""The ingest package loads a reader when it is first named, not every reader at once."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import etstore.formats
from etstore.formats import chakra_json, et, recognise


def _loaded_after(statement: str) -> list[str]:
    """The ``etstore.formats`` modules a fresh interpreter holds after running ``statement``."""
    listing = "json.dumps(sorted(m for m in sys.modules if m.startswith('etstore.formats')))"
    code = f"import json, sys\n{statement}\nprint({listing})"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    return list(json.loads(out))


def test_reading_et_files_loads_only_the_et_reader() -> None:
    # what a simulation of exported .et files imports: no Kineto, PyTorch, MSCCL or JSON readers
    # (the native codec's two modules are there when it is built)
    loaded = set(_loaded_after("from etstore.formats.et import read_et"))
    assert {
        "etstore.formats",
        "etstore.formats._frames",
        "etstore.formats.et",
        "etstore.formats.files",
    } <= loaded
    assert loaded <= {
        "etstore.formats",
        "etstore.formats._et_encode",  # the writing half of et.py, re-exported there
        "etstore.formats._et_kind",  # recognises an exported algorithm
        "etstore.formats._etcodec",
        "etstore.formats._frames",
        "etstore.formats._native",
        "etstore.formats.et",
        "etstore.formats.files",
    }


def test_recognising_a_format_loads_its_reader_only() -> None:
    """read_trace imports the reader of what it recognised (the shipped .et example and
    MSCCL-IR ring), none of the others."""
    root = Path(__file__).resolve().parents[2] / "examples"
    readers = {"chakra_json", "et", "kineto", "msccl_xml", "pytorch_et"}
    for path, reader in (
        (root / "transformer_8r" / "transformer", "et"),
        (root / "algorithms" / "ring_allreduce_4r.xml", "msccl_xml"),
    ):
        loaded = _loaded_after(f"from etstore.formats import read_trace\nread_trace({str(path)!r})")
        assert {m.rsplit(".", 1)[1] for m in loaded} & readers == {reader}, path


def test_naming_a_reader_on_the_package_loads_its_module() -> None:
    loaded = _loaded_after("from etstore.formats import read_chakra_json")
    assert "etstore.formats.chakra_json" in loaded and "etstore.formats.msccl_writer" not in loaded
    assert "etstore.formats.msccl_writer" in _loaded_after("import etstore.formats as i\ni.write_msccl_xml")


def test_every_exported_name_is_the_defining_modules_own() -> None:
    for name in etstore.formats.__all__:
        value = getattr(etstore.formats, name)
        assert value.__module__.startswith("etstore.formats."), name
    assert etstore.formats.read_et is et.read_et and etstore.formats.write_et is et.write_et
    assert etstore.formats.read_trace is recognise.read_trace
    assert etstore.formats.read_chakra_json is chakra_json.read_chakra_json
    assert set(etstore.formats.__all__) <= set(dir(etstore.formats))


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match=r"module 'etstore\.formats' has no attribute 'read_nothing'"):
        etstore.formats.read_nothing  # noqa: B018
