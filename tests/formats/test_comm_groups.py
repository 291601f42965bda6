"""Communicator groups as ASTRA-sim reads them: comm-group files (keys through ``stoi``), and
the ``pg_name``s and group file an ``.et`` export writes."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.compute as pc
import pytest

from etstore.errors import ConfigError
from etstore.formats.comm_groups import astra_group_plan, find_group
from etstore.formats.et import read_et, write_et
from etstore.formats.export import export_trace
from etstore.formats.files import read_comm_groups, stoi
from etstore.model import Trace, ops_table


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "groups.json"
    path.write_text(text)
    return path


def test_stoi_reads_as_cpp_does() -> None:
    assert [stoi(x) for x in ("0.0", "01", " 7", "+3", "-2", "1.5", "12abc")] == [0, 1, 7, 3, -2, 1, 12]
    assert [stoi(x) for x in ("dp0", "", " ", "-", "x1", "2147483648")] == [None] * 6
    assert stoi("2147483647") == 2**31 - 1 and stoi("-2147483648") == -(2**31)


def test_group_keys_are_read_as_astra_sim_reads_them(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # ASTRA-sim's Workload::initialize_comm_groups stoi()s every key: "0.0" is group 0
    path = _write(tmp_path, '{"0.0": [3, 1], "02": [0, 2], "5": [4]}')
    with caplog.at_level("WARNING"):
        assert read_comm_groups(path) == {"0": [3, 1], "2": [0, 2], "5": [4]}  # members in file order
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.endswith("communicator group keys read as ASTRA-sim reads them (stoi): '0.0' -> 0, '02' -> 2")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            '{"dp0": [0, 1]}',
            r"groups\.json: communicator group key 'dp0' is not a group number; ASTRA-sim reads",
        ),
        ('{"": [0]}', r"groups\.json: communicator group key '' is not a group number"),
        ('{"9999999999": [0]}', r"key '9999999999' is not a group number"),
        ('{"1": [0], "01": [1]}', r"groups\.json: keys '1' and '01' both name communicator group 1"),
    ],
)
def test_keys_stoi_rejects_are_one_line_errors_naming_the_file(
    tmp_path: Path, text: str, message: str
) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        read_comm_groups(_write(tmp_path, text))
    assert "\n" not in str(info.value)


def test_a_pg_name_finds_its_group_as_astra_sim_finds_it() -> None:
    groups = {"0": [0, 1], "tp0": [2, 3]}
    assert [find_group(x, groups) for x in ("0", "0.0", "00", "tp0", "1", "x")] == [
        "0",
        "0",
        "0",
        "tp0",
        None,
        None,
    ]


def _grouped(names: list[str]) -> Trace:
    """Four ranks, one all-reduce each; rank r carries ``names[r]``."""
    return Trace(
        ops_table(
            {
                "rank": [0, 1, 2, 3],
                "id": [1, 1, 1, 1],
                "type": ["COMM_COLL_NODE"] * 4,
                "comm_type": ["ALL_REDUCE"] * 4,
                "comm_size": [4096] * 4,
                "pg_name": names,
            }
        ),
        name="g",
    )


def test_pg_names_astra_sim_reads_survive_ingest_and_export(tmp_path: Path) -> None:
    # "1.0" and "2.0" are groups 1 and 2 for ASTRA-sim (stoi): export keeps them as written,
    # and the group file keeps their spelling and the members' order (the ring's order)
    write_et(_grouped(["1.0", "1.0", "2.0", "2.0"]), tmp_path / "in" / "g")
    (tmp_path / "in" / "g.comm_groups.json").write_text('{"1.0": [1, 0], "2.0": [3, 2]}')
    back = read_et(tmp_path / "in" / "g")
    out = export_trace(back, tmp_path / "out" / "g")
    again = read_et(tmp_path / "out" / "g")
    assert again.ops["pg_name"].to_pylist() == ["1.0", "1.0", "2.0", "2.0"]
    assert json.loads(out[-1].read_text()) == {"1.0": [1, 0], "2.0": [3, 2]}
    assert again.params["comm_groups"] == {"1": [1, 0], "2": [3, 2]}
    assert out.changes == ()


def test_names_astra_sim_cannot_read_are_renamed_and_said(tmp_path: Path) -> None:
    # "0.0" is group 0 to ASTRA-sim, whose CommunicatorGroup asserts ids > 0; "0" of one rank
    # would be read as every NPU; "x" is no number; "3" stays
    trace = _grouped(["0.0", "0", "3", "x"])
    plan = astra_group_plan(trace)
    assert plan.rename == {"0": "4", "0.0": "5", "x": "6"}
    assert plan.groups == {"3": [2], "4": [1], "5": [0], "6": [3]}
    out = export_trace(trace, tmp_path / "g")
    assert out.changes == (
        "pg_name '0' -> '4': ASTRA-sim reads '0' as every NPU, but group 0 is ranks [1]",
        "pg_name '0.0' -> '5': ASTRA-sim reads it as group 0 and asserts group ids > 0",
        "pg_name 'x' -> '6': ASTRA-sim reads pg_name with stoi, which needs a number",
    )
    assert pc.drop_null(read_et(tmp_path / "g").ops["pg_name"]).to_pylist() == ["5", "4", "3", "6"]


def test_verbatim_writes_the_names_as_stored(tmp_path: Path) -> None:
    trace = _grouped(["0.0", "0.0", "x", "x"])
    out = export_trace(trace, tmp_path / "g", verbatim=True)
    assert out.changes == ()
    assert read_et(tmp_path / "g").ops["pg_name"].to_pylist() == ["0.0", "0.0", "x", "x"]
