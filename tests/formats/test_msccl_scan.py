"""The C scanner of MSCCL-IR XML against expat: same steps where it accepts, None elsewhere.

The scanner only has to be right about what it accepts (anything else goes to expat,
which reports errors), so each accepted document is compared field by field with
the expat parse, and each declined one is checked to be declined rather than
misread.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from etstore.formats import msccl_xml as mx
from etstore.testing import msccl_doc as doc
from etstore.testing import msccl_step as step
from etstore.testing import msccl_tb as tb
from etstore.testing import ring_allreduce_xml

pytestmark = pytest.mark.needs_extension("etstore.formats._xmlscan")

FIXTURES = (
    "msccl/*.xml",
    "astra-sim/examples/system/custom_collectives/custom_ring_allreduce_8npus_1MB/custom_allreduce.xml",
)


def raw(text: str | bytes) -> bytes:
    data = text.encode() if isinstance(text, str) else text
    return data


def assert_same(data: bytes) -> None:
    """The scanner's parse equals expat's: attributes, steps, threadblocks and lines."""
    ours = mx._native(data)
    ref = mx._expat(data, "<test>")
    assert ours.algo == ref.algo and ours.gpus == ref.gpus and ours.tbs == ref.tbs
    assert ours.tb_gpu == ref.tb_gpu
    assert ours.steps.keys() == ref.steps.keys()
    for key, col in ref.steps.items():
        np.testing.assert_array_equal(ours.steps[key], col, err_msg=key)
    np.testing.assert_array_equal(ours.step_tb, ref.step_tb)
    lines = [data.count(b"\n", 0, int(at)) + 1 for at in ours.step_at]
    assert lines == ref.step_at.tolist()
    assert [data.count(b"\n", 0, at) + 1 for at in ours.tb_at] == ref.tb_at


@pytest.mark.shared_files(*FIXTURES)
def test_every_step_fixture_is_scanned_like_expat(shared_file: Path) -> None:
    data = raw(shared_file.read_bytes())
    if b"<op " in data:  # the <op> form is expat's
        assert mx._xmlscan.scan(data, mx._SCAN_TYPES, mx._SCAN_BUFS) is None
        return
    assert mx._xmlscan.scan(data, mx._SCAN_TYPES, mx._SCAN_BUFS) is not None
    assert_same(data)


ONE = doc(
    tb(0, 1, -1, step(0, "s", "i", 0, "o", 1), step(1, "r", "i", 1, "o", 3, cnt=2, depid=0, deps=0)),
    tb(0, -1, 0, step(0, "rrc", "o", 0, "s", 1)),
)


@pytest.mark.parametrize(
    "variant",
    [
        lambda t: t,
        lambda t: re.sub(r'<step s="(\d+)" type="(\w+)"', r'<step type="\2" s="\1"', t),  # reordered
        lambda t: t.replace('"', "'"),  # single quotes
        lambda t: t.replace(' cnt="', ' cnt = "').replace("/>", " />"),  # spaces around = and before />
        lambda t: '<?xml version="1.0" encoding="utf-8"?>\n<!-- <gpu> & "x" -->\n' + t + "<!-- end -->\n",
        lambda t: "\ufeff" + t,  # byte-order mark
        lambda t: t.replace('srcoff="1"', 'srcoff=" +1 "').replace('dstoff="3"', 'dstoff="003"'),
        lambda t: t.replace('depid="-1"', 'depid="-1" ', 1).replace("\n", "\r\n"),
        lambda t: t.replace(' hasdep="0"', ""),  # hasdep is optional: derived from deps
    ],
)
def test_accepted_variants_read_like_expat(variant) -> None:
    text = variant(ONE)
    data = raw(text)
    assert mx._xmlscan.scan(data, mx._SCAN_TYPES, mx._SCAN_BUFS) is not None, text
    assert_same(data)


@pytest.mark.parametrize(
    "edit",
    [
        lambda t: t.replace('type="r"', 'type="rx"'),  # unknown step type: expat names it
        lambda t: t.replace(' cnt="2"', ""),  # missing attribute
        lambda t: t.replace(' cnt="2"', ' cnt="2" cnt="2"'),  # duplicate attribute
        lambda t: t.replace(' cnt="2"', ' cnt="2" extra="1"'),  # unknown attribute
        lambda t: t.replace('cnt="2"', 'cnt="2x"'),  # not an integer
        lambda t: t.replace('cnt="2"', 'cnt="1_0"'),  # Python's int() reads it; expat path does
        lambda t: t.replace('cnt="2"', 'cnt="1234567890123456789"'),  # beyond 18 digits
        lambda t: t.replace('srcbuf="o"', 'srcbuf="x"'),  # not a buffer
        lambda t: t.replace('srcbuf="o"', 'srcbuf="&#111;"'),  # character reference
        lambda t: t.replace('<gpu id="1"', '<gpu note="a &amp; b" id="1"'),  # entity anywhere
        lambda t: '<!DOCTYPE algo [<!ENTITY a "b">]>' + t,
        lambda t: t.replace("</tb>", "<![CDATA[x]]></tb>", 1),
        lambda t: t.replace("</tb>", "</gpu>", 1),  # mismatched end tag
        lambda t: t[: len(t) // 2],  # truncated
        lambda t: t + t,  # two roots
        lambda t: t + "junk",  # text after the root
        lambda t: t.replace("/>", "></step>", 1),  # a step with an end tag
        lambda t: t.replace('<step s="0" type="s"', '<op step="0" type="s"', 1),  # <op> form
        lambda t: t.replace("<tb ", "<x/><tb ", 1),  # unexpected element
        lambda t: t.replace('cnt="2"', 'cnt="2"depid="0"'),  # no space between attributes
        lambda t: t.replace("<gpu", "<?pi x?><gpu", 1),  # processing instruction
    ],
)
def test_declined_documents_go_to_expat(edit) -> None:
    data = raw(edit(ONE))
    assert mx._xmlscan.scan(data, mx._SCAN_TYPES, mx._SCAN_BUFS) is None


def test_steps_outside_a_threadblock_are_declined() -> None:
    text = ONE.replace(
        '<gpu id="0" i_chunks="2" o_chunks="2" s_chunks="2">',
        '<gpu id="0" i_chunks="2" o_chunks="2" s_chunks="2">' + step(9, "s"),
    )
    assert mx._xmlscan.scan(raw(text), mx._SCAN_TYPES, mx._SCAN_BUFS) is None


def test_large_ring_is_scanned_not_declined() -> None:
    """The benchmark's ring all-reduce takes the scanner (a decline would cost 10x silently)."""
    data = raw(ring_allreduce_xml(16))
    got = mx._xmlscan.scan(data, mx._SCAN_TYPES, mx._SCAN_BUFS)
    assert got is not None and got[4] == 16 * (4 * 16 - 4)
    assert_same(data)
