"""What counts as the same content: every field of every node and the metadata frame for every
trace; for an algorithm also its header parameters (not how the file spelled them)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from etstore.formats import read_et
from etstore.formats.msccl_xml import parse_msccl_xml
from etstore.model import OPS_SCHEMA
from etstore.store._identity import identity, upgraded_identity
from etstore.workloads import transformer


def _with_cell(table: pa.Table, column: str, row: int, value: object) -> pa.Table:
    values = table[column].to_pylist()
    values[row] = value
    i = table.schema.get_field_index(column)
    return table.set_column(i, table.schema.field(i), pa.array(values, table.schema.field(i).type))


@pytest.mark.parametrize("column", [f.name for f in OPS_SCHEMA if f.name not in ("rank", "id")])
def test_every_op_field_counts(column: str) -> None:
    trace = transformer(ranks=2, layers=1, tp=1)
    col = trace.ops[column]
    old = col[3].as_py()
    if pa.types.is_string(col.type):
        new: object = "changed"
    elif pa.types.is_boolean(col.type):
        new = not old
    elif pa.types.is_binary(col.type):
        new = b"\x01"
    else:
        new = (old or 0) + 1
    changed = trace.replace(ops=_with_cell(trace.ops, column, 3, new))
    assert identity(changed) != identity(trace)
    assert identity(trace.replace(name="other", source="elsewhere")) == identity(trace)


def test_dependencies_and_the_metadata_frame_count(rt_template: Path) -> None:
    trace = read_et(rt_template)
    assert trace.meta.num_rows == 8 and trace.meta["metadata"][0].as_py()  # a real GlobalMetadata frame
    meta = _with_cell(trace.meta, "metadata", 0, trace.meta["metadata"][0].as_py() + b"\x00")
    assert identity(trace.replace(meta=meta)) != identity(trace)
    work = transformer(ranks=2, layers=1, tp=1)
    kinds = pc.if_else(pc.equal(work.deps["kind"], "data"), "ctrl", "data")
    assert identity(work.replace(deps=work.deps.set_column(3, "kind", kinds))) != identity(work)


def test_algorithm_header_counts_but_not_its_spelling(shared_fixture: Callable[[str], Path]) -> None:
    text = shared_fixture("msccl/allreduce-allpairs-8n-ll-32tb.xml").read_text()
    base = parse_msccl_xml(text)
    for old, new in (
        ('proto="LL"', 'proto="Simple"'),
        ('maxBytes="65536"', 'maxBytes="32768"'),
        ('name="allreduce_pairs"', 'name="pairs"'),
        ('nchannels="4"', 'nchannels="8"'),
    ):
        assert old in text
        other = parse_msccl_xml(text.replace(old, new, 1))
        assert other.ops.equals(base.ops) and identity(other) != identity(base), new
    extra = parse_msccl_xml(text.replace("<algo ", '<algo redop="max" ', 1))
    assert identity(extra) != identity(base)
    respelled = parse_msccl_xml(text.replace('inplace="1"', 'inplace="01"', 1))
    assert identity(respelled) == identity(base)
    provenance = base.replace(params={**base.params, "producer": "generator", "seed": 3})
    assert identity(provenance) == identity(base)
    workload = transformer(ranks=2, layers=1, tp=1)
    assert upgraded_identity("abc", "workload", {"x": 1}) == "abc"
    assert identity(workload.replace(params={"other": 1})) == identity(workload)
