"""The optional C extensions: declared as optional builds, importable where the build is required.

Each extension has a Python fallback, so a machine without a C compiler still installs
and runs etstore (the parity tests skip there). Under CI (``CI=true``) a missing
extension is a failure instead: ``pip install -e .`` (``make install``) must have built it.
"""

from __future__ import annotations

import ast
import importlib.machinery
import os
import subprocess
import sys
import unittest
from pathlib import Path

import pytest

from etstore.testing import ExtensionMissingError, require_extension

ROOT = Path(__file__).resolve().parents[1]
SETUP = ROOT / "setup.py"


def declared_extensions() -> dict[str, dict[str, object]]:
    """``Extension(name, sources=..., optional=...)`` calls in setup.py: name → keyword values."""
    found: dict[str, dict[str, object]] = {}
    for node in ast.walk(ast.parse(SETUP.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Extension":
            name = ast.literal_eval(node.args[0])
            found[name] = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords if kw.arg}
    return found


EXTENSIONS = sorted(declared_extensions())


def test_setup_declares_every_c_source_as_an_optional_extension() -> None:
    sources = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "etstore").rglob("*.c"))
    declared = declared_extensions()
    assert sorted(s for kw in declared.values() for s in kw["sources"]) == sources  # type: ignore[attr-defined]
    assert EXTENSIONS == ["etstore.formats._etcodec", "etstore.formats._xmlscan", "etstore.sim._simloop"]
    for name, kw in declared.items():
        assert kw.get("optional") is True, f"{name}: a failed build must not fail the install"


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.needs_extension(n)) for n in EXTENSIONS])
def test_extension_is_built_and_importable(name: str) -> None:
    module = require_extension(name)
    assert isinstance(module.__loader__, importlib.machinery.ExtensionFileLoader), module


def test_missing_extension_skips_outside_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(unittest.SkipTest, match=r"etstore\.formats\._absent is not available .*C compiler"):
        require_extension("etstore.formats._absent")


def test_missing_extension_fails_under_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    with pytest.raises(
        ExtensionMissingError,
        match=r"C extensions: etstore\.formats\._absent is not available .*`pip install -e \.`",
    ):
        require_extension("etstore.formats._absent")


def test_a_failed_compile_does_not_fail_the_build(tmp_path: Path) -> None:
    """What `pip install` runs, with a compiler that always fails: warnings, exit code 0."""
    env = {**os.environ, "CC": "false", "LDSHARED": "false"}
    build = ["build_ext", "--build-lib", str(tmp_path / "lib"), "--build-temp", str(tmp_path / "tmp")]
    proc = subprocess.run(
        [sys.executable, "setup.py", "-q", *build],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    for name in EXTENSIONS:
        assert f'building extension "{name}" failed' in proc.stdout + proc.stderr
    assert not list((tmp_path / "lib").rglob("*.so"))
