"""CLI for algorithms and topologies: check, algo gen, export to MSCCL-IR / ASTRA-sim, topo, synth."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from etstore.algorithms.generators import generate
from etstore.cli import main
from etstore.formats import read_et
from etstore.store import open_store


def run(capsys: pytest.CaptureFixture[str], store: Path, *args: str) -> tuple[int, str, str]:
    code = main(["--store", str(store), *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_check_every_msccl_fixture_and_a_broken_algorithm(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, shared_fixture: Callable[[str], Path]
) -> None:
    xmls = sorted(str(p) for p in shared_fixture("msccl").glob("*.xml"))
    assert len(xmls) >= 10
    code, out, _ = run(capsys, tmp_path / "s", "check", *xmls, "--format", "json")
    docs = json.loads(out)
    assert code == 0 and len(docs) == len(xmls) and all(d["ok"] for d in docs)
    # drop rank 1's last receive of a 4-rank ring: rank 0's last send is never received
    algo = generate("ring", coll="allreduce", ranks=4)
    ops = algo.ops
    last_recv = int(
        np.flatnonzero(
            pc.and_(pc.equal(ops["rank"], 1), pc.equal(ops["type"], "COMM_RECV_NODE")).to_numpy(
                zero_copy_only=False
            )
        )[-1]
    )
    rid = ops["id"][last_recv].as_py()
    keep = np.ones(ops.num_rows, dtype=bool)
    keep[last_recv] = False
    deps = algo.deps
    touches = pc.and_(
        pc.equal(deps["rank"], 1), pc.or_(pc.equal(deps["src"], rid), pc.equal(deps["dst"], rid))
    )
    broken = algo.replace(ops=ops.filter(pa.array(keep)), deps=deps.filter(pc.invert(touches)), name="broken")
    with open_store(tmp_path / "s", write=True) as store:
        store.ingest(broken)
    code, out, _ = run(capsys, tmp_path / "s", "check", "broken")
    assert code == 1
    assert "is never received" in out and "rank 0" in out


def test_algo_gen_export_xml_round_trip_and_astra_et(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    s = tmp_path / "s"
    code, out, _ = run(
        capsys,
        s,
        "algo",
        "gen",
        "ring",
        "--coll",
        "allreduce",
        "--ranks",
        "8",
        "--chunks",
        "2",
        "--format",
        "json",
    )
    (row,) = json.loads(out)
    # ring all-reduce, N=8, k=2: per channel 2(N-1) sends per rank → 8·2·14 = 224 messages
    assert code == 0 and row["trace"] == "ring-allreduce-8r-2c" and row["messages"] == 224
    code, out, _ = run(
        capsys, s, "export", "ring-allreduce-8r-2c", "--format", "msccl-xml", "--out", str(tmp_path / "ring")
    )
    assert code == 0 and out.strip() == f"wrote 1 file: {tmp_path / 'ring.xml'}"
    # XML → store gives the same DAG and header: the same content, stored once, which the
    # file's own name now also points at
    code, out, _ = run(capsys, s, "ingest", str(tmp_path / "ring.xml"), "--format", "json")
    assert code == 0 and json.loads(out)[0]["trace"] == "ring"
    with open_store(s, read_only=True) as store:
        ids = {t.name: t.trace_id for t in store.traces()}
    assert ids == {"ring-allreduce-8r-2c": ids["ring"], "ring": ids["ring"]}
    code, out, _ = run(
        capsys,
        s,
        "export",
        "ring-allreduce-8r-2c",
        "--coll-size",
        "1MiB",
        "--out",
        str(tmp_path / "et" / "ring"),
    )
    assert code == 0 and out.splitlines() == [f"wrote 8 files: {tmp_path / 'et' / 'ring.0.et'} ... ring.7.et"]
    written = read_et(tmp_path / "et" / "ring")
    sends = written.ops.filter(pc.equal(written.ops["type"], "COMM_SEND_NODE"))
    # 16 chunks of 1 MiB / 16 = 64 KiB each; every send carries one chunk
    assert set(sends["comm_size"].to_pylist()) == {65536}
    # ASTRA-sim reads the chunk fields as int32_val (field 7), so that is what is written
    assert all("msg_chunk_cnt:7" in order for order in written.ops["attr_order"].to_pylist())
    code, _, err = run(
        capsys, s, "export", "ring-allreduce-8r-2c", "--format", "json", "--coll-size", "1MiB", "--out", "x"
    )
    assert code == 1 and err.count("\n") == 1 and "a collective size applies only" in err


def test_topo_show_and_synth_against_tacos(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    s = tmp_path / "s"
    code, out, _ = run(capsys, s, "topo", "show", "mesh2d:8x8,bw=50,lat=500", "--format", "json")
    (doc,) = json.loads(out)  # one row
    # 8x8 mesh: 2·8·7 undirected = 224 directed links, diameter 14, bisection 8 links · 50 GB/s
    assert code == 0 and (doc["npus"], doc["links"], doc["diameter_hops"]) == (64, 224, 14)
    assert doc["bisection_bandwidth_gb_per_s"] == 400.0
    code, out, _ = run(
        capsys, s, "synth", "--topo", "mesh2d:5x5,bw=50,lat=500", "--coll", "allgather", "--format", "json"
    )
    (doc,) = json.loads(out)
    # TACOS's published All-Gather of 1 GiB on a 5x5 mesh, 50 GiB/s, 0.5 µs: 9606 µs
    assert code == 0 and doc["time_ns"] == pytest.approx(9606e3, rel=0.01) and doc["ratio"] >= 1.0
    code, out, _ = run(capsys, s, "check", doc["trace"])
    assert code == 0 and "ok: allgather on 25 ranks" in out
    code, _, err = run(capsys, s, "topo", "show", "mesh2d:0x8")
    assert code == 1 and err.startswith("etstore: error:") and err.count("\n") == 1


def _trace_names(store: Path) -> list[str]:
    with open_store(store) as s:
        return [t.name for t in s.traces()]


def test_synth_bad_topology_stores_nothing(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    s = tmp_path / "s"
    code, _, err = run(capsys, s, "synth", "--topo", "hypercube:5", "--coll", "allreduce")
    assert code == 1 and err.count("\n") == 1
    assert _trace_names(s) == []
