"""A write that fails for want of space leaves every view agreeing, and reads working with no later
write (issue 35, round 2, item 2).

Each case runs a real ``etstore`` writer (``ingest``, ``rm``, or a ``cypher`` that has to build
the graph index) on a store that has nearly no room left, then checks, before any space is
freed, that the writer said why in one line and that ``ls``, SQL (the views and the raw
content rows) and Cypher agree on every trace and its op count; then space is freed and the
write succeeds, and they agree again.

Where the test may mount one (as root), the store lives on a 20 MiB tmpfs filled to leave a
given headroom: a real full disk (``ENOSPC``). Both as root and elsewhere, the same cases
also run with the writer under ``RLIMIT_FSIZE`` set to the store's largest file plus the
headroom, a stand-in that needs no mount: growing a file past it fails with ``EFBIG`` (``File
too large``), while blocks already in a file can be rewritten, as on a full disk. (A limit
below a file's size is no stand-in: DuckDB's checkpoint rewrites a partly filled block in
place, and a write cut short there, which a full ext4, XFS or tmpfs never does, leaves a
block whose checksum fails; see ``docs/reliability.md``.) With a per-file limit the journal
always fits and a removal may fit; those cases then check that the views agree.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from etstore.cli import main
from etstore.formats.comm_groups import write_astra_et
from etstore.store import EmbeddedStore
from etstore.workloads import transformer

_SCRIPT = Path(sys.executable).parent / "etstore"
CLI = [sys.executable, str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "etstore.cli"]
SMALL = {"ranks": 4, "layers": 2, "tp": 2}  # 76 ops
BIG = {"ranks": 64, "layers": 100, "tp": 2}  # 45,120 ops: about 3 MB in DuckDB, 7 MB in the graph
OUT_OF_SPACE = ("No space left on device", "File too large")


class Tight:
    """A store on a file system with little room: a filled tmpfs, or a file size limit."""

    def __init__(self, root: Path, mounted: bool) -> None:
        self.root = root
        self.store = root / "s"
        self.mounted = mounted
        self.limit: int | None = None

    def leave(self, kib: int) -> None:
        """Leave ``kib`` KiB for the next write."""
        if self.mounted:
            st = os.statvfs(self.root)
            free = st.f_bavail * st.f_frsize
            with open(self.root / "filler", "wb") as f:
                f.truncate(0)
                f.write(b"\0" * max(0, free - kib * 1024))
        else:  # no file may grow past the largest by more than ``kib`` KiB (see the module docstring)
            self.limit = max(f.stat().st_size for f in self.store.iterdir() if f.is_file()) + kib * 1024

    def free(self) -> None:
        (self.root / "filler").unlink(missing_ok=True)
        self.limit = None

    def etstore(self, *args: str) -> subprocess.CompletedProcess[str]:
        """``etstore --store STORE ARGS`` in a process under the current limit."""
        limit = self.limit

        def restrict() -> None:
            if limit is not None:
                resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

        env = {**os.environ, "CI": "true", "ETSTORE_WAIT": "60"}
        return subprocess.run(
            [*CLI, "--store", str(self.store), *args],
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
            preexec_fn=restrict,
        )


def _mount(where: Path) -> bool:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=20m", "tmpfs", str(where)], capture_output=True, text=True
    )
    return done.returncode == 0


@pytest.fixture(params=["tmpfs", "fsize"])
def tight(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Tight]:
    root = tmp_path / "fs"
    root.mkdir()
    mounted = request.param == "tmpfs" and _mount(root)
    if request.param == "tmpfs" and not mounted:
        pytest.skip("cannot mount a tmpfs here (needs root): the fsize case stands in for it")
    try:
        with EmbeddedStore(root / "s") as s:
            s.ingest(transformer(**SMALL, name="small"), name="small")
            s.cypher("MATCH (o:Op) RETURN count(o)")  # the index holds it
        yield Tight(root, mounted)
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(root)], check=False)


@pytest.fixture(scope="module")
def big_files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("inputs")
    write_astra_et(transformer(**BIG, name="big"), d / "big")
    return d / "big"


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("etstore: error: "), err
    return lines[0]


def _views(store: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, int]:
    """``ls``, SQL and Cypher, read in this process (no limit) and compared; returns name -> ops."""
    capsys.readouterr()
    assert main(["--store", str(store), "ls", "--format", "json"]) == 0
    listed = {t["name"]: t["ops"] for t in json.loads(capsys.readouterr().out)}
    with EmbeddedStore(store, read_only=True) as s:
        assert {t.name: t.ops for t in s.traces()} == listed
        by_sql = {
            r["trace"]: r["n"] for r in s.sql("SELECT trace, count(*) AS n FROM ops GROUP BY 1").to_pylist()
        }
        raw = s.sql("SELECT count(*) FROM trace_ops").scalar()
        by_graph = {
            r["t"]: r["n"]
            for r in s.cypher(
                "MATCH (x:Trace), (o:Op) WHERE o.trace_id = x.trace_id RETURN x.name AS t, count(o) AS n"
            ).to_pylist()
        }
    assert by_sql == listed, "SQL and ls disagree"
    assert raw == sum(listed.values()), "rows of no committed trace are visible"
    assert by_graph == listed, "Cypher and ls disagree"
    assert not (store / "journal.json").exists()
    return listed


# headroom in KiB: none (the journal cannot be written), a few pages (DuckDB's commit fails),
# part of the rows (an INSERT fails midway)
@pytest.mark.parametrize("kib", [0, 16, 300])
def test_an_ingest_that_runs_out_of_space(
    tight: Tight, big_files: Path, capsys: pytest.CaptureFixture[str], kib: int
) -> None:
    tight.leave(kib)
    done = tight.etstore("ingest", str(big_files))
    if done.returncode == 0:  # a per-file limit lets a journal or a small commit through
        assert not tight.mounted, done.stdout
        pytest.skip(f"the ingest fit in {kib} KiB per file")
    assert done.returncode == 1
    line = _one_line(done.stderr)
    assert any(why in line for why in OUT_OF_SPACE) and str(tight.store) in line, line  # what and where
    assert _views(tight.store, capsys) == {"small": 76}  # before any space is freed
    tight.free()
    again = tight.etstore("ingest", str(big_files))
    assert again.returncode == 0, again.stderr
    assert _views(tight.store, capsys) == {"small": 76, "big": 45_120}


@pytest.mark.parametrize("kib", [0, 16, 64])
def test_a_removal_that_runs_out_of_space(
    tight: Tight, big_files: Path, capsys: pytest.CaptureFixture[str], kib: int
) -> None:
    assert tight.etstore("ingest", str(big_files)).returncode == 0
    both = {"small": 76, "big": 45_120}
    assert _views(tight.store, capsys) == both  # and the index holds both
    tight.leave(kib)
    done = tight.etstore("rm", "big")
    if done.returncode == 0:  # a per-file limit lets a small delete through
        assert not tight.mounted, done.stdout
        assert _views(tight.store, capsys) == {"small": 76}
        return
    assert done.returncode == 1
    line = _one_line(done.stderr)
    assert any(why in line for why in OUT_OF_SPACE) and str(tight.store) in line, line  # what and where
    assert _views(tight.store, capsys) == both  # before any space is freed
    tight.free()
    again = tight.etstore("rm", "big")
    assert again.returncode == 0 and again.stdout.strip() == "removed big", again.stderr
    assert _views(tight.store, capsys) == {"small": 76}


@pytest.mark.parametrize("kib", [8, 200, 2000])
def test_a_graph_index_build_that_runs_out_of_space(
    tight: Tight, big_files: Path, capsys: pytest.CaptureFixture[str], kib: int
) -> None:
    with EmbeddedStore(tight.store) as s:  # stored, not indexed yet
        s.ingest(transformer(**BIG, name="big"), name="big")
    tight.leave(kib)
    done = tight.etstore("cypher", "MATCH (o:Op) RETURN count(o)")
    if done.returncode == 0:
        assert not tight.mounted, done.stdout
        pytest.skip(f"the build fit in {kib} KiB per file")
    assert done.returncode == 1
    line = _one_line(done.stderr)
    assert "graph index" in line and any(why in line for why in OUT_OF_SPACE), line
    capsys.readouterr()
    assert (
        main(["--store", str(tight.store), "sql", "--format", "json", "SELECT dirty FROM graph_state"]) == 0
    )
    dirty = json.loads(capsys.readouterr().out)[0]["dirty"]
    if dirty:  # the build had begun: it is to be built over, and its files are gone with their space
        assert "failed" in line and not (tight.store / "graph").exists()
    else:  # it could not even begin: the graph is as it was
        assert "nothing was changed" in line and (tight.store / "graph").exists()
    assert main(["--store", str(tight.store), "ls", "--format", "json"]) == 0
    assert {t["name"] for t in json.loads(capsys.readouterr().out)} == {"small", "big"}
    tight.free()
    assert _views(tight.store, capsys) == {"small": 76, "big": 45_120}
