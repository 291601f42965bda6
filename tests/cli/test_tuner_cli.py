"""``etstore tuner`` as the user runs it: the config it writes, read back by the plugin's rules;
the JSON the same as the table; what it leaves out said on stderr; bad input in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from etstore.cli import main
from etstore.formats.tuner_config import config_problems, match_tuner_config, read_tuner_config

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "tuner" / "nccl_tuner_4r.csv"
RL = ROOT / "examples" / "tuner" / "rl_tuner_4r.jsonl"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def store(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> str:
    s = str(tmp_path / "s")
    code, _, err = run(capsys, "--store", s, "ingest", str(EXAMPLE), str(RL))
    assert code == 0, err
    return s


def test_run_to_csv_and_json(capsys: pytest.CaptureFixture[str], store: str, tmp_path: Path) -> None:
    conf, doc = tmp_path / "nccl_tuner.conf", tmp_path / "tuner.json"
    code, out, err = run(
        capsys, "--store", store, "tuner", "--run", "nccl_tuner_4r", "--csv", str(conf), "--json", str(doc),
        "--format", "json",
    )  # fmt: skip
    assert code == 0, err
    rows = json.loads(out)
    written = json.loads(doc.read_text())
    assert written["buckets"] == rows  # the JSON file holds the table as printed
    assert written["source"] == {
        "kind": "tuner run", "id": 1, "name": "nccl_tuner_4r", "topology": None, "protocol": None,
    }  # fmt: skip
    lines = read_tuner_config(conf)
    assert config_problems(conf.read_bytes()) == []
    assert [{"line": c.line, **dict(zip(written["fields"], c.fields(), strict=True))} for c in lines] == [
        {k: str(v) if k != "line" else v for k, v in row.items()} for row in written["config"]
    ]
    # each logged size, answered by the winner of its bucket (worked out in tests/app/test_tuner_config.py)
    answers = {
        size: match_tuner_config(lines, "allreduce", size, nodes=1, ranks=4)
        for size in (1024, 1536, 65536, 1048576)
    }
    assert {s: (c.algorithm, c.protocol, c.channels) if c else None for s, c in answers.items()} == {
        1024: ("tree", "ll", 2),
        1536: ("tree", "ll", 2),
        65536: ("ring", "ll128", 4),
        1048576: None,  # the stored ring won: left out
    }
    assert [r["config_line"] for r in rows] == [5, 6, None]
    assert err.splitlines() == [
        f"warning: left out of {conf}: ALL_REDUCE 1048576..2097151 B, ranks 4, nodes 1, topology dgx-a-4g: "
        "ring_allreduce_4r/Simple/2ch: the choice ran algorithm trace 'ring_allreduce_4r', not an NCCL "
        "algorithm",
        f"etstore: wrote {conf} (NCCL example tuner plugin config)",
        f"etstore: wrote {doc} (JSON)",
    ]


def test_a_change_the_config_makes_is_said(
    capsys: pytest.CaptureFixture[str], store: str, tmp_path: Path
) -> None:
    conf = tmp_path / "rl.conf"
    code, out, err = run(capsys, "--store", store, "tuner", "--run", "2", "--csv", str(conf))
    assert code == 0, err
    assert conf.read_text().splitlines()[4:] == [
        "allreduce,4096,8191,tree,ll,2,-1,4",  # no nodes logged: any
        "allreduce,1048576,2097151,ring,simple,8,-1,4",
    ]
    assert (
        f"{conf} line 6 (ALL_REDUCE 1048576..2097151 B, ranks 4, topology dgx-a-4g): chunk_bytes 131072"
        in err
    )
    assert "rl_tuner_4r: 2 size bucket(s), 2 NCCL config line(s), 0 bucket(s) left out" in out


def test_a_sweep_with_and_without_a_protocol(
    capsys: pytest.CaptureFixture[str], store: str, tmp_path: Path
) -> None:
    code, _, err = run(
        capsys, "--store", store, "sweep", "--coll", "allreduce", "--sizes", "1KiB,2KiB",
        "--algo", "ring,tree", "--topo", "ring:4,bw=50,lat=500", "--format", "json",
    )  # fmt: skip
    assert code == 0, err
    bare, given = tmp_path / "bare.conf", tmp_path / "given.conf"
    code, out, err = run(
        capsys, "--store", store, "tuner", "--sweep", "1", "--csv", str(bare), "--format", "csv"
    )
    assert code == 0 and read_tuner_config(bare) == [] and out.startswith("topology,collective,ranks,nodes")
    assert err.count("a simulation models no NCCL protocol: give --protocol to write it") == 2
    code, out, err = run(
        capsys, "--store", store, "tuner", "--sweep", "1", "--protocol", "Simple", "--csv", str(given),
        "--format", "json",
    )  # fmt: skip
    assert code == 0 and "warning" not in err
    winners = {r["size_bucket_bytes"]: r["algorithm"] for r in json.loads(out)}
    lines = read_tuner_config(given)
    for size in (1024, 2048):
        line = match_tuner_config(lines, "allreduce", size, nodes=1, ranks=4)
        assert line is not None and (line.algorithm, line.protocol) == (winners[size], "simple")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--run", "nope"], "etstore: error: no tuner run 'nope'"),
        (["--sweep", "7"], "etstore: error: no sweep 7"),
        (["--sweep", "first"], "etstore: error: sweep 'first': a sweep is named by its id, an integer"),
        (["--run", "nccl_tuner_4r", "--protocol", "ll"], "etstore: error: --protocol is for --sweep"),
        (["--run", "nccl_tuner_4r", "--topology", "x"], "etstore: error: nccl_tuner_4r has no topology 'x'"),
        (
            ["--calibration", "fit"],
            "etstore: error: --calibration 'fit': a calibration fits one algorithm's network parameters",
        ),
    ],
)
def test_bad_input_is_one_line(
    capsys: pytest.CaptureFixture[str], store: str, argv: list[str], message: str
) -> None:
    code, out, err = run(capsys, "--store", store, "tuner", *argv)
    assert code == 1 and out == "" and err.startswith(message) and len(err.splitlines()) == 1, err


def test_no_store_and_no_source(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    missing = tmp_path / "none"
    code, _, err = run(capsys, "--store", str(missing), "tuner", "--run", "x")
    assert code == 1 and err.startswith(f"etstore: error: no store at {missing}") and not missing.exists()
    with pytest.raises(SystemExit) as exit_:
        main(["--store", str(missing), "tuner"])
    assert exit_.value.code == 2 and "one of the arguments --run --sweep --calibration is required" in (
        capsys.readouterr().err
    )


def test_an_unwritable_file_is_one_line(
    capsys: pytest.CaptureFixture[str], store: str, tmp_path: Path
) -> None:
    code, _, err = run(
        capsys, "--store", store, "tuner", "--run", "1", "--csv", str(tmp_path / "no" / "x.conf")
    )
    assert code == 1 and err.startswith("etstore: error: No such file or directory") and str(tmp_path) in err
