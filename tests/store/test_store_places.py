"""Where a store may be made, and the files it keeps there (issue 35, round 2, item 7).

- A link planted as ``lock`` (or ``lock.readers``, ``journal.json``, a temporary file, the
  listing) made the next writer truncate or overwrite what it names: such files are now
  opened without following links, and a link is refused in one line or replaced, never
  written through.
- ``--store`` naming any existing directory (``--store ''``: the current one) turned it into
  a store: one is now made only in a new or empty directory, or where one already is.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from etstore.cli import main
from etstore.errors import StoreError
from etstore.store import EmbeddedStore, open_store
from etstore.store.info import FORMAT_VERSION
from etstore.testing import p2p_trace

PRECIOUS = "precious: nothing may write here\n"


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    path = tmp_path / "victim.txt"
    path.write_text(PRECIOUS)
    return path


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("etstore: error: "), err
    return lines[0]


def _stored(path: Path) -> Path:
    with EmbeddedStore(path) as s:
        s.ingest(p2p_trace(1024), name="t")
    return path


# ------------------------------------------------------------------ links


@pytest.mark.parametrize("name", ["lock", "lock.readers", "journal.json"])
@pytest.mark.parametrize("write", [True, False])
def test_a_link_in_place_of_a_lock_or_journal_is_refused(
    tmp_path: Path, victim: Path, capsys: pytest.CaptureFixture[str], name: str, write: bool
) -> None:
    store = _stored(tmp_path / "s")
    (store / name).unlink(missing_ok=True)
    (store / name).symlink_to(victim)
    with pytest.raises(StoreError, match=f"{name} is a symbolic link") as got:
        EmbeddedStore(store, read_only=not write, wait_s=0)
    assert "\n" not in str(got.value)
    capsys.readouterr()
    assert main(["--store", str(store), "rm" if write else "sql", "t" if write else "SELECT 1"]) == 1
    assert "is a symbolic link" in _one_line(capsys.readouterr().err)
    assert victim.read_text() == PRECIOUS
    (store / name).unlink()
    with open_store(store) as s:  # the link removed, the store is as it was
        assert [t.name for t in s.traces()] == ["t"]


def test_planted_temporary_files_are_replaced_not_written_through(tmp_path: Path, victim: Path) -> None:
    """The journal and the listing are written through temporary files beside them; a link planted
    under a temporary name (this process's PID included, as older versions named them) is
    removed, and ``removed.json`` or ``listing.json`` as links are replaced."""
    store = _stored(tmp_path / "s")
    for name in ("journal.json", "listing.json", "removed.json"):
        for tmp in (f"{name}.tmp", f"{name}.{os.getpid()}.tmp"):
            (store / tmp).symlink_to(victim)
    (store / "removed.json").symlink_to(victim)
    with EmbeddedStore(store) as s:  # writes the journal, then the listing at close
        s.ingest(p2p_trace(2048), name="u")
        s.remove("u")  # notes the name in removed.json
    assert victim.read_text() == PRECIOUS
    assert not (store / "removed.json").is_symlink() and json.loads((store / "removed.json").read_text()) == [
        "u"
    ]
    assert not (store / "listing.json").is_symlink()


def test_a_listing_that_is_a_link_is_not_believed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``ls`` reads the listing a writer left; one planted as a link could make it list anything."""
    store = _stored(tmp_path / "s")
    forged = tmp_path / "forged.json"
    row = json.loads((store / "listing.json").read_text())["traces"][0]
    forged.write_text(json.dumps({"format": FORMAT_VERSION, "traces": [{**row, "name": "forged"}]}))
    (store / "listing.json").unlink()
    (store / "listing.json").symlink_to(forged)
    capsys.readouterr()
    assert main(["--store", str(store), "ls", "--format", "json"]) == 0
    assert [t["name"] for t in json.loads(capsys.readouterr().out)] == ["t"]


# ------------------------------------------------------------------ where a store is made


def test_a_directory_holding_other_files_is_not_made_a_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "home"
    (home / "src").mkdir(parents=True)
    (home / "notes.txt").write_text("mine\n")
    before = sorted(p.name for p in home.iterdir())
    for write in (True, False):
        with pytest.raises(
            StoreError, match=r"home: is not an etstore store and is not empty \(it holds 'notes"
        ):
            EmbeddedStore(home, read_only=not write)
    for args in (["ls"], ["sql", "SELECT 1"], ["rm", "x"], ["cypher", "MATCH (n) RETURN n"]):
        capsys.readouterr()
        assert main(["--store", str(home), *args]) == 1, args
        assert "a store is created only in a new or empty directory" in _one_line(capsys.readouterr().err)
    assert sorted(p.name for p in home.iterdir()) == before  # not a lock file more


def test_an_empty_store_location_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)  # '' would be the current directory, empty or not
    for args in (["ls"], ["sql", "SELECT 1"], ["cypher", "MATCH (n) RETURN n"]):
        capsys.readouterr()
        assert main(["--store", "", *args]) == 1
        assert "the store location is empty" in _one_line(capsys.readouterr().err)
    with pytest.raises(StoreError, match="the store location is empty"):
        open_store("", write=True)
    assert list(tmp_path.iterdir()) == []


def test_stores_are_still_made_where_they_may_be(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    leftovers = tmp_path / "leftovers"  # an open interrupted before its warehouse was written
    leftovers.mkdir()
    for name in ("lock", "lock.readers", "journal.json"):
        (leftovers / name).write_text("")
    for where in (tmp_path / "new" / "deeper", empty, leftovers, _stored(tmp_path / "existing")):
        with EmbeddedStore(where) as s:
            s.ingest(p2p_trace(4096), name="w")
        with open_store(where) as s:
            assert "w" in [t.name for t in s.traces()]
