"""Chrome trace-event JSON out, read back with a strict reader written from the format's spec.

The reader below knows the Trace Event Format (the JSON object form: ``traceEvents``,
``displayTimeUnit``; complete ``X`` events with ``ts``/``dur`` in µs, metadata ``M``
events, flow ``s``/``t``/``f`` events bound to an enclosing slice with ``bp: "e"``,
counter ``C`` events with numeric ``args``) and nothing of etstore; every count and
duration it finds is compared with the warehouse's own rows, queried independently. When
HolisticTraceAnalysis (PyPI) is installed, its trace loader reads the run's file too.
"""

from __future__ import annotations

import itertools
import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from etstore.cli import main
from etstore.errors import OptionError, UnknownTraceError
from etstore.formats.chrome_trace import trace_timeline, write_chrome_trace
from etstore.formats.export import export_trace
from etstore.model import Trace, ops_table
from etstore.report.timeline import run_timeline, write_run_timeline
from etstore.store import EmbeddedStore
from etstore.testing import RecordedStore as Recorded

_NUM = (int, float)
_META = {"process_name", "process_sort_index", "thread_name", "thread_sort_index"}


def read_trace_events(path: Path) -> list[dict[str, Any]]:
    """The events of a trace-event JSON file, each checked against the format's required fields."""
    doc = json.loads(path.read_text())
    assert isinstance(doc, dict) and isinstance(doc["traceEvents"], list)
    assert doc.get("displayTimeUnit", "ms") in ("ms", "ns")
    for ev in doc["traceEvents"]:
        ph = ev["ph"]
        assert isinstance(ev["name"], str) and isinstance(ev["pid"], int)
        if ph == "X":
            assert isinstance(ev["tid"], int) and isinstance(ev["ts"], _NUM) and isinstance(ev["dur"], _NUM)
            assert ev["dur"] >= 0 and isinstance(ev.get("args", {}), dict)
        elif ph == "M":
            assert ev["name"] in _META and isinstance(ev["args"], dict)
        elif ph in ("s", "t", "f"):
            assert isinstance(ev["id"], int) and isinstance(ev["cat"], str) and isinstance(ev["ts"], _NUM)
            assert isinstance(ev["tid"], int)
            assert ph == "s" or ev["bp"] == "e"
        elif ph == "C":
            assert (
                isinstance(ev["ts"], _NUM)
                and ev["args"]
                and all(isinstance(v, _NUM) for v in ev["args"].values())
            )
        else:
            raise AssertionError(f"unexpected phase {ph!r}")
    return doc["traceEvents"]


def check_tracks_and_flows(events: list[dict[str, Any]]) -> None:
    """Slices of a track never overlap; each flow runs s (t...) f, every step inside a slice of its track."""
    tracks: dict[tuple[int, int], list[tuple[float, float]]] = defaultdict(list)
    for ev in events:
        if ev["ph"] == "X":
            tracks[(ev["pid"], ev["tid"])].append((ev["ts"], ev["ts"] + ev["dur"]))
    for spans in tracks.values():
        spans.sort()
        for (_, end), (start, _) in itertools.pairwise(spans):
            assert start >= end - 1e-6
    flows: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for ev in events:
        if ev["ph"] in ("s", "t", "f"):
            flows[ev["id"]].append(ev)
    for steps in flows.values():
        phases = [e["ph"] for e in steps]
        assert phases[0] == "s" and phases[-1] == "f" and set(phases[1:-1]) <= {"t"}
        for e in steps:
            assert any(a - 1e-6 <= e["ts"] <= b + 1e-6 for a, b in tracks[(e["pid"], e["tid"])])


@pytest.fixture(scope="module")
def written(recorded: Recorded, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    run = recorded.runs[1]  # the congestion-aware run: links carry measured busy time
    with EmbeddedStore(recorded.path, read_only=True) as store:
        path = write_run_timeline(store.warehouse, run, tmp_path_factory.mktemp("tl") / "run")
    return path, run


def test_a_run_reads_back_with_one_slice_per_timed_op(
    written: tuple[Path, int], store: EmbeddedStore
) -> None:
    path, run = written
    assert path.name == "run.json"
    events = read_trace_events(path)
    check_tracks_and_flows(events)
    ranks = {r for (r,) in store.sql("SELECT DISTINCT rank FROM op_timings WHERE run_id = $r", {"r": run})}
    slices = [e for e in events if e["ph"] == "X" and e["pid"] in ranks]
    by_type = Counter(e["args"]["type"] for e in slices)
    want = dict(
        store.sql(
            "SELECT type, count(*) FROM op_timings WHERE run_id = $r AND end_ns IS NOT NULL GROUP BY type",
            {"r": run},
        )
    )
    assert by_type == want and sum(want.values()) > 100
    durations = defaultdict(float)
    for e in slices:
        durations[e["pid"]] += e["dur"]
    for rank, total_ns in store.sql(
        "SELECT rank, sum(end_ns - start_ns) FROM op_timings WHERE run_id = $r GROUP BY rank", {"r": run}
    ):
        assert durations[rank] == pytest.approx(total_ns / 1e3, rel=1e-9)
    compute = [e for e in slices if e["args"]["type"] == "COMP_NODE"]
    assert {e["cat"] for e in compute} == {"compute"} and all(e["tid"] < 1000 for e in compute)
    assert all(e["tid"] >= 1001 for e in slices if e["args"]["type"].startswith("COMM_"))


def test_collectives_messages_and_links(written: tuple[Path, int], store: EmbeddedStore) -> None:
    path, run = written
    events = read_trace_events(path)
    names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    coll_pid = next(p for p, n in names.items() if n == "collectives")
    net_pid = next(p for p, n in names.items() if n == "network")
    instances = [e for e in events if e["ph"] == "X" and e["pid"] == coll_pid]
    rows = store.sql("SELECT start_ns, time_ns FROM collectives WHERE run_id = $r", {"r": run}).to_pylist()
    assert len(instances) == len(rows) > 0
    assert sorted(e["dur"] for e in instances) == pytest.approx(sorted(r["time_ns"] / 1e3 for r in rows))
    counters = [e for e in events if e["ph"] == "C"]
    links = store.sql("SELECT src, dst, utilization FROM link_util WHERE run_id = $r", {"r": run}).to_pylist()
    assert len(counters) == 2 * len(links) and {e["pid"] for e in counters} == {net_pid}
    at_zero = {e["name"]: e["args"]["utilization"] for e in counters if e["ts"] == 0}
    assert at_zero == pytest.approx({f"link {r['src']}->{r['dst']}": r["utilization"] for r in links})
    flows = Counter((e["cat"], e["ph"]) for e in events if e["ph"] in ("s", "t", "f"))
    trace = store.sql("SELECT trace FROM runs WHERE run_id = $r", {"r": run}).scalar()
    messages = store.sql("SELECT count(*) FROM messages WHERE trace = $t", {"t": trace}).scalar()
    assert flows[("message", "s")] == flows[("message", "f")] == messages > 0
    # one collective flow per instance that spans more than one rank
    multi = store.sql(
        "SELECT count(*) FROM collectives WHERE run_id = $r AND group_size > 1", {"r": run}
    ).scalar()
    assert flows[("collective", "s")] == flows[("collective", "f")] == multi


def test_unknown_run(store: EmbeddedStore) -> None:
    with pytest.raises(UnknownTraceError, match=r"no simulation run 999 is recorded"):
        run_timeline(store.warehouse, 999)


def test_cli_timeline_of_a_run(
    capsys: pytest.CaptureFixture[str], recorded: Recorded, tmp_path: Path
) -> None:
    out = tmp_path / "t.json"
    code = main(["--store", str(recorded.path), "timeline", str(recorded.runs[0]), "--out", str(out)])
    assert code == 0 and capsys.readouterr().out.strip() == str(out)
    assert any(e["ph"] == "X" for e in read_trace_events(out))
    code = main(["--store", str(recorded.path), "timeline", "12345", "--out", str(out)])
    assert code == 1 and "no simulation run 12345" in capsys.readouterr().err


# ---------------------------------------------------------------- a trace with its own timestamps


def _timed_trace(stamps: bool = True) -> Trace:
    """Two ranks: compute, then rank 0 sends 1 MiB to rank 1 (send 10-15 µs, receive 12-20 µs)."""
    ops = ops_table(
        {
            "rank": [0, 0, 1, 1],
            "id": [0, 1, 0, 1],
            "name": ["fwd", "send", "fwd", "recv"],
            "type": ["COMP_NODE", "COMM_SEND_NODE", "COMP_NODE", "COMM_RECV_NODE"],
            "duration_micros": np.array([10, 5, 12, 8], np.uint64),
            "start_time_micros": np.array([0, 10, 0, 12], np.uint64) * (1 if stamps else 0),
            "comm_size": [None, 1 << 20, None, 1 << 20],
            "comm_src": [None, None, None, 0],
            "comm_dst": [None, 1, None, None],
            "comm_tag": [None, 7, None, 7],
        }
    )
    return Trace(ops, name="timed")


def test_a_timestamped_trace(tmp_path: Path) -> None:
    [path] = export_trace(_timed_trace(), tmp_path / "timed", format="chrome-trace")
    events = read_trace_events(path)
    check_tracks_and_flows(events)
    slices = sorted((e["pid"], e["name"], e["ts"], e["dur"]) for e in events if e["ph"] == "X")
    assert slices == [(0, "fwd", 0, 10), (0, "send", 10, 5), (1, "fwd", 0, 12), (1, "recv", 12, 8)]
    flow = sorted((e["ph"], e["pid"], e["ts"]) for e in events if e["ph"] in "sf")
    assert flow == [("f", 1, 12.0), ("s", 0, 10.0)]
    assert trace_timeline(_timed_trace())["otherData"]["trace"] == "timed"


def test_a_trace_without_timestamps(tmp_path: Path) -> None:
    with pytest.raises(OptionError, match=r"trace 'timed' has no timestamps"):
        write_chrome_trace(_timed_trace(stamps=False), tmp_path / "x")
    assert not (tmp_path / "x.json").exists()


def test_cli_timeline_of_a_stored_trace(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    with EmbeddedStore(tmp_path / "s") as store:
        store.ingest(_timed_trace())
        store.ingest(_timed_trace(stamps=False).replace(name="flat"))
    out = tmp_path / "timed.json"
    assert main(["--store", str(tmp_path / "s"), "timeline", "timed", "--out", str(out)]) == 0
    events = read_trace_events(out)
    assert sum(e["ph"] == "X" and e["pid"] < 2 for e in events) == 4  # the ranks; the critical path follows
    capsys.readouterr()
    assert main(["--store", str(tmp_path / "s"), "timeline", "flat", "--out", str(out)]) == 1
    assert "trace 'flat' has no timestamps" in capsys.readouterr().err


def test_holistic_trace_analysis_reads_the_run(written: tuple[Path, int], store: EmbeddedStore) -> None:
    # HTA's own trace loader (HolisticTraceAnalysis on PyPI), an independent reader of the format
    parser = pytest.importorskip("hta.common.trace_parser", reason="HolisticTraceAnalysis is not installed")
    config = pytest.importorskip("hta.configs.parser_config")
    path, run = written
    cfg = config.ParserConfig(config.ParserConfig.get_minimum_args())
    cfg.parser_backend = config.ParserBackend.JSON
    meta, df, symbols = parser.parse_trace_dataframe(str(path), cfg)
    assert meta["otherData"]["run_id"] == run
    ops = store.sql("SELECT count(*) FROM op_timings WHERE run_id = $r", {"r": run}).scalar()
    instances = store.sql("SELECT count(*) FROM collectives WHERE run_id = $r", {"r": run}).scalar()
    assert len(df) == ops + instances  # HTA keeps the complete events
    names = symbols.get_sym_table()
    ranks = store.sql("SELECT count(DISTINCT rank) FROM op_timings WHERE run_id = $r", {"r": run}).scalar()
    per_rank = df[df["pid"] < ranks].groupby("pid")["dur"].sum()
    counts = df[df["pid"] < ranks].groupby("pid").size()
    for rank, total_ns in store.sql(
        "SELECT rank, sum(end_ns - start_ns) FROM op_timings WHERE run_id = $r GROUP BY rank", {"r": run}
    ):
        # HTA rounds each timestamp and duration down to whole µs
        assert total_ns / 1e3 - counts[rank] <= per_rank[rank] <= total_ns / 1e3
    want = {n for (n,) in store.sql("SELECT DISTINCT name FROM op_timings WHERE run_id = $r", {"r": run})}
    assert want <= {names[i] for i in df["name"].unique()}
