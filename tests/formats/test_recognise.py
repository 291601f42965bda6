"""``read_trace`` recognises inputs by content (gzip or not), never by file name."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from etstore.cli import main
from etstore.errors import TraceFormatError
from etstore.formats import read_trace
from etstore.formats._frames import write_varint
from etstore.formats.files import (
    CHAKRA_ET,
    CHAKRA_JSON,
    KINETO,
    MSCCL_XML,
    PYTORCH_ET,
    rank_in_name,
    sniff_format,
)
from etstore.proto import GlobalMetadata, Node

SOURCES = {
    CHAKRA_ET: "chakra/feeder_tests_trace.0.et",
    CHAKRA_JSON: "chakra/json_trace.small_chakra.0.json",
    PYTORCH_ET: "pytorch/1.0.2-chakra.0.0.4.json",
    KINETO: "pytorch/hta/benchmark_simple_add_trace.json.gz",
    MSCCL_XML: "msccl/all-reduce-ring-simple.xml",
}


def _plain(path: Path) -> bytes:
    data = path.read_bytes()
    return gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data


@pytest.mark.parametrize("fmt", sorted(SOURCES))
@pytest.mark.parametrize("packed", [False, True], ids=["plain", "gzip"])
def test_content_decides_not_the_name(fmt: str, packed: bool, shared_fixture: Any, tmp_path: Path) -> None:
    source = shared_fixture(SOURCES[fmt])
    data = _plain(source)
    misleading = tmp_path / "looks_like.0.et"  # the same misleading name for every format
    misleading.write_bytes(gzip.compress(data) if packed else data)
    assert sniff_format(misleading) == fmt
    if fmt == MSCCL_XML and packed:
        with pytest.raises(TraceFormatError, match=r"looks_like\.0\.et: gzip-compressed MSCCL-IR XML"):
            read_trace(misleading)
        return
    got = read_trace(misleading, name="t")
    assert got.num_ops > 0 and got.num_ops == read_trace(source, name="t").num_ops


def test_formats_the_readers_report(shared_fixture: Any) -> None:
    kineto = read_trace(shared_fixture(SOURCES[KINETO]))
    assert kineto.params["recognised"]["format"] == "kineto"
    et = read_trace(shared_fixture(SOURCES[PYTORCH_ET]))
    assert et.params["recognised"]["format"] == "pytorch-et" and et.params["durations"] == "absent"
    assert read_trace(shared_fixture(SOURCES[MSCCL_XML])).kind == "algorithm"


def test_a_frame_length_that_looks_like_json_or_xml_is_still_chakra(tmp_path: Path) -> None:
    """A GlobalMetadata of 123 bytes starts the file with '{', one of 60 bytes with '<'."""
    for size, first in ((123, b"{"), (60, b"<"), (91, b"[")):
        meta = GlobalMetadata(version="v" * (size - 2)).SerializeToString()
        assert len(meta) == size
        node = Node(id=1, name="n", type=4).SerializeToString()
        path = tmp_path / f"m{size}.0.et"
        path.write_bytes(write_varint(len(meta)) + meta + write_varint(len(node)) + node)
        assert path.read_bytes()[:1] == first
        assert sniff_format(path) == CHAKRA_ET
        assert read_trace(path).ops["name"].to_pylist() == ["n"]


@pytest.mark.parametrize(
    ("name", "rank"),
    [
        ("rank0_et.json", 0),
        ("rank12_kineto.json.gz", 12),
        ("worker3_step_12.1694128201557.pt.trace.json", 3),
        ("dlrm_eg_3.json", 3),
        ("kineto_trace_rank_5.json", 5),
        ("resnet_et.json.gz", None),
    ],
)
def test_rank_in_name(name: str, rank: int | None) -> None:
    assert rank_in_name(name) == rank


def _pair_dir(tmp_path: Path, shared_fixture: Any, ranks: range) -> Path:
    et_dir, kineto_dir = shared_fixture("pytorch/dlrm_8r_et"), shared_fixture("pytorch/dlrm_8r_kineto")
    out = tmp_path / "pair"
    out.mkdir()
    for r in ranks:
        shutil.copy(et_dir / f"dlrm_eg_{r}.json", out / f"rank{r}_et.json")
        (kineto,) = kineto_dir.glob(f"worker{r}_*.pt.trace.json")
        shutil.copy(kineto, out / f"rank{r}_kineto.json")
    return out


def test_et_and_kineto_of_each_rank_are_linked(tmp_path: Path, shared_fixture: Any) -> None:
    t = read_trace(_pair_dir(tmp_path, shared_fixture, range(8)))
    assert t.name == "pair" and t.ranks == list(range(8))
    rec = t.params["recognised"]
    assert rec["format"] == "pytorch-et" and rec["collectives"] == {"ALL_REDUCE": 24, "ALL_TO_ALL": 40}
    assert t.params["durations"] == "kineto" and rec["linked_fraction"] > 0.9


def test_a_rank_with_an_et_but_no_kineto(tmp_path: Path, shared_fixture: Any) -> None:
    folder = _pair_dir(tmp_path, shared_fixture, range(8))
    (folder / "rank3_kineto.json").unlink()
    with pytest.raises(TraceFormatError, match=r"pair: rank 3 has an execution trace but no Kineto trace"):
        read_trace(folder)


def test_a_directory_of_ets_missing_one(tmp_path: Path, shared_fixture: Any) -> None:
    src = shared_fixture("pytorch/dlrm_8r_et")
    for r in (0, 1, 3):
        shutil.copy(src / f"dlrm_eg_{r}.json", tmp_path / f"dlrm_eg_{r}.json")
    t = read_trace(tmp_path)  # a capture of some ranks: a trace of those, and a line saying so
    assert t.ranks == [0, 1, 3]
    # the ETs alone (schema 1.0.1) name no group: the world is as large as the highest rank says
    assert t.params["recognised"]["warnings"][0].startswith("ranks 0-1, 3 of 4 recorded (none for ranks 2)")


def test_pytorch_and_chakra_files_do_not_mix(tmp_path: Path, shared_fixture: Any) -> None:
    shutil.copy(shared_fixture(SOURCES[PYTORCH_ET]), tmp_path / "rank0_et.json")
    shutil.copy(shared_fixture(SOURCES[CHAKRA_ET]), tmp_path / "rank1.1.et")
    with pytest.raises(TraceFormatError, match=r"rank1\.1\.et: not a PyTorch trace, unlike the other files"):
        read_trace(tmp_path)


def test_unknown_json_and_empty_files(tmp_path: Path) -> None:
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"hello": [1, 2]}))
    with pytest.raises(
        TraceFormatError, match=r"other\.json: a JSON document that is no trace etstore reads"
    ):
        read_trace(other)
    empty = tmp_path / "empty.json"
    empty.write_bytes(gzip.compress(b""))
    with pytest.raises(TraceFormatError, match=r"empty\.json: empty file"):
        read_trace(empty)
    cut = tmp_path / "cut.json"
    cut.write_text('{"traceEvents": [{"ph": "X"')
    with pytest.raises(TraceFormatError, match=r"cut\.json: not valid JSON"):
        read_trace(cut)


def test_cli_ingest_prints_what_it_recognised(
    tmp_path: Path, shared_fixture: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    kineto = shared_fixture("pytorch/dlrm_8r_kineto")
    code = main(["--store", str(tmp_path / "s"), "ingest", str(kineto), "--format", "json"])
    out, err = capsys.readouterr()
    assert code == 0 and json.loads(out)[0]["trace"] == "dlrm_8r_kineto"  # stdout stays JSON
    assert (
        "etstore: dlrm_8r_kineto: kineto; 8 ranks; 19,781 ops; collectives: ALL_REDUCE 24, ALL_TO_ALL 40"
        in err
    )
    code = main(["--store", str(tmp_path / "s"), "ingest", str(shared_fixture(SOURCES[PYTORCH_ET]))])
    out, _ = capsys.readouterr()
    assert code == 0 and "pytorch-et" in out and "durations absent" in out


def test_an_execution_trace_without_nodes(tmp_path: Path) -> None:
    path = tmp_path / "rank0_et.json"  # recognised as an ET by its keys, refused by the ET reader
    path.write_text(json.dumps({"schema": "1.0.1", "pid": 1, "nodes": []}))
    assert sniff_format(path) == PYTORCH_ET
    with pytest.raises(TraceFormatError, match=r"rank0_et\.json: the PyTorch execution trace has no nodes"):
        read_trace(path)


def test_reading_rank_files_reports_each_file(rt_template: Path) -> None:
    # ASTRA-sim's rt_template workload: chakra_trace.0.et .. chakra_trace.7.et
    seen: list[tuple[int, int]] = []
    trace = read_trace(rt_template, progress=lambda done, total: seen.append((done, total)))
    assert seen == [(k, 8) for k in range(9)]
    assert trace.num_ranks == 8
    one: list[tuple[int, int]] = []
    read_trace(rt_template / "chakra_trace.3.et", progress=lambda d, t: one.append((d, t)))
    assert one == []  # a single file is one step: the caller reports it
