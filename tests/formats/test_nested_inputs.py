"""Deeply nested JSON in the other inputs a user gives (system config, communicator groups, a
Chakra JSON trace, an execution trace's process-group list): a one-line error naming the file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from etstore.errors import ConfigError, TraceFormatError
from etstore.formats.chakra_json import read_chakra_json
from etstore.formats.files import read_comm_groups
from etstore.formats.pytorch_et import read_pytorch_et
from etstore.sim.config import read_system_config

DEEP = "[" * 200_000 + "]" * 200_000


def test_a_deep_system_config(tmp_path: Path) -> None:
    p = tmp_path / "system.json"
    p.write_text(DEEP)
    with pytest.raises(ConfigError, match=r"system\.json: JSON nested too deeply"):
        read_system_config(p)


def test_deep_communicator_groups(tmp_path: Path) -> None:
    p = tmp_path / "groups.json"
    p.write_text('{"1": ' + DEEP + "}")
    with pytest.raises(ConfigError, match=r"groups\.json: JSON nested too deeply"):
        read_comm_groups(p)


def test_a_deep_chakra_json(tmp_path: Path) -> None:
    p = tmp_path / "trace.0.json"
    p.write_text(DEEP)
    with pytest.raises(TraceFormatError, match=r"trace\.0\.json: .*nested too deeply"):
        read_chakra_json(p)


def test_a_deep_process_group_list_in_an_execution_trace(tmp_path: Path) -> None:
    doc = {
        "schema": "1.1.1-chakra.0.0.4",
        "nodes": [
            {"id": 1, "name": "[pytorch|profiler|execution_trace|process]", "ctrl_deps": 0, "attrs": []},
            {
                "id": 2,
                "name": "## process_group:init ##",
                "ctrl_deps": 1,
                "inputs": {"values": [DEEP], "shapes": [[]], "types": ["String"]},
                "attrs": [],
            },
        ],
    }
    p = tmp_path / "rank0_et.json"
    p.write_text(json.dumps(doc))
    with pytest.raises(TraceFormatError, match=r"rank0_et\.json: node 2 .*nests too deeply"):
        read_pytorch_et(p)
