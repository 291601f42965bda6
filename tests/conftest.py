"""Shared fixtures: the third-party files in ../shared/fixtures, the C extensions, a fresh store.

Test modules never import each other or this file; what they share reaches them as
fixtures and markers from here, or as builders from :mod:`etstore.testing`.

- ``shared_fixture(relpath)`` (fixture): the path of a file under ../shared/fixtures, or
  a skip saying it is absent.
- ``@pytest.mark.shared_files(glob, ...)``: parametrizes the test's ``shared_file``
  argument over the matching files (one skipped case when none exist).
- ``terminal`` (fixture): the environment of a terminal (rich's ``FORCE_COLOR``, no CI), for
  what draws progress bars.
- ``@pytest.mark.needs_extension(module)``: the test needs a C extension; it skips when
  the extension is not built, and fails when the environment variable CI is ``true``
  (:func:`etstore.testing.require_extension`, which tests may also call directly).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest

from etstore.store import EmbeddedStore
from etstore.testing import require_extension

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "fixtures"
CUSTOM_ALLREDUCE = "astra-sim/examples/system/custom_collectives/custom_ring_allreduce_8npus_1MB"
RT_TEMPLATE = "astra-sim/tests/rt_template/inputs"
NEO4J_ENV = "ETSTORE_TEST_NEO4J"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "shared_files(*globs): parametrize `shared_file` over ../shared/fixtures"
    )
    config.addinivalue_line("markers", "needs_extension(module): the test needs this C extension built")


# ---------------------------------------------------------------- ../shared/fixtures


def shared_path(relpath: str) -> Path:
    """``relpath`` under ../shared/fixtures; skips the calling test when it is absent."""
    path = SHARED / relpath
    if not path.exists():
        pytest.skip(f"fixture {relpath} not available ({SHARED} missing or incomplete)")
    return path


@pytest.fixture
def shared_fixture() -> Callable[[str], Path]:
    """``shared_fixture("chakra/x.et")``: the path, or a skip when the file is absent."""
    return shared_path


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    mark = metafunc.definition.get_closest_marker("shared_files")
    if mark is None:
        return
    if "shared_file" not in metafunc.fixturenames:
        raise pytest.UsageError(f"{metafunc.function.__name__}: shared_files needs a `shared_file` argument")
    paths = sorted({p for pattern in mark.args for p in SHARED.glob(pattern)})
    if paths:
        metafunc.parametrize("shared_file", paths, ids=[str(p.relative_to(SHARED)) for p in paths])
        return
    reason = f"no fixture matches {', '.join(mark.args)} ({SHARED} missing or incomplete)"
    metafunc.parametrize("shared_file", [pytest.param(None, marks=pytest.mark.skip(reason=reason))])


@pytest.fixture(scope="session")
def gen_et() -> ModuleType:
    """``bench/gen_et.py``, the generator of large multi-rank ``.et`` traces (bench/ is no
    package), loaded once (its dataclasses and its process pool's pickling look it up in
    ``sys.modules``)."""
    path = Path(__file__).resolve().parents[1] / "bench" / "gen_et.py"
    loaded = sys.modules.get("gen_et")
    if loaded is not None and Path(str(loaded.__file__)) == path:
        return loaded
    spec = importlib.util.spec_from_file_location("gen_et", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def feeder() -> Path:
    return shared_path("chakra/feeder_tests_trace.0.et")


@pytest.fixture
def rt_inputs() -> Path:
    """ASTRA-sim's rt_template inputs: system_cfg.json, network_cfg.yml, workload/."""
    return shared_path(RT_TEMPLATE)


@pytest.fixture
def rt_template() -> Path:
    return shared_path(f"{RT_TEMPLATE}/workload")


@pytest.fixture
def custom_allreduce() -> Path:
    """ASTRA-sim's 8-NPU custom ring all-reduce: the .et files and custom_allreduce.xml."""
    return shared_path(CUSTOM_ALLREDUCE)


@pytest.fixture
def custom_allreduce_xml() -> Path:
    return shared_path(f"{CUSTOM_ALLREDUCE}/custom_allreduce.xml")


@pytest.fixture
def astra_networks() -> Path:
    """ASTRA-sim's analytical network files (Ring_8npus.yml, HGX-H100-validated.yml, ...)."""
    return shared_path("astra-sim/examples/network/analytical")


# ---------------------------------------------------------------- C extensions


def pytest_runtest_setup(item: pytest.Item) -> None:
    for mark in item.iter_markers("needs_extension"):
        require_extension(mark.args[0])
    if item.get_closest_marker("slow") and "slow" not in (item.config.getoption("markexpr") or ""):
        pytest.skip("slow: opt-in with pytest -m slow")


# ---------------------------------------------------------------- stores


@pytest.fixture
def store(tmp_path: Path) -> Iterator[EmbeddedStore]:
    with EmbeddedStore(tmp_path / "store") as s:
        yield s


@pytest.fixture
def neo4j_url() -> str:
    """The test server's URL, or a skip saying why there is none."""
    url = os.environ.get(NEO4J_ENV)
    if url:
        return url
    missing = [tool for tool in ("java", "mvn") if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"Neo4j cases need {' and '.join(missing)} (JDK 17, Maven 3.8+) to run a local server")
    pytest.skip(f"no Neo4j server: run `make test`, or export {NEO4J_ENV}=$(scripts/neo4j.sh start)")


@pytest.fixture
def terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the renderer sees on a terminal: rich's FORCE_COLOR, and no CI."""
    monkeypatch.setenv("FORCE_COLOR", "1")
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.delenv("TTY_COMPATIBLE", raising=False)
