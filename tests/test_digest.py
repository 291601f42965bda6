"""The content digest: the same for a trace however its rows arrive (whole, chunked, in parts)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from etstore import digest
from etstore.digest import ContentDigest, content_hash
from etstore.formats import read_et
from etstore.model import Trace
from etstore.testing import rank_parts
from etstore.workloads import transformer


def _digest_of(parts: list[Trace], kind: str) -> str:
    d = ContentDigest(kind)
    for p in parts:
        d.update(p)
    return d.hexdigest()


def test_stored_identities_keep_their_values(custom_allreduce: Path) -> None:
    # digests stores already hold (computed before part-by-part hashing existed) stay valid
    assert content_hash(read_et(custom_allreduce)) == "68627fa2741bc051823b59d6fd587c4fea7427fb"
    assert content_hash(transformer(ranks=4, layers=1, tp=1)) == "96cb5180b056f6a08ba1bf7a5fc62d1da54d25d2"


@pytest.mark.parametrize("small", [False, True])
def test_parts_and_chunks_hash_as_the_whole(
    custom_allreduce: Path, monkeypatch: pytest.MonkeyPatch, small: bool
) -> None:
    if small:  # long columns: hashed piece by piece, pieces cut across parts
        monkeypatch.setattr(digest, "WHOLE_ROWS", 20)
        monkeypatch.setattr(digest, "PIECE_ROWS", 7)
    trace = read_et(custom_allreduce)
    whole = content_hash(trace)
    for cuts in ([1], [3, 4, 7], list(range(1, 8))):
        assert _digest_of(rank_parts(trace, cuts), str(trace.kind)) == whole
    rechunked = trace.replace(ops=pa.concat_tables([trace.ops.slice(0, 13), trace.ops.slice(13)]))
    assert content_hash(rechunked) == whole


@pytest.mark.parametrize("small", [False, True])
def test_any_changed_row_changes_the_digest(
    custom_allreduce: Path, monkeypatch: pytest.MonkeyPatch, small: bool
) -> None:
    if small:
        monkeypatch.setattr(digest, "WHOLE_ROWS", 20)
        monkeypatch.setattr(digest, "PIECE_ROWS", 7)
    trace = read_et(custom_allreduce)
    whole = content_hash(trace)
    ops = trace.ops
    dur = ops["duration_micros"].to_numpy().copy()
    dur[-1] += 1  # the last row: in the last piece
    assert content_hash(trace.replace(ops=ops.set_column(4, "duration_micros", pa.array(dur)))) != whole
    # a null where a value was (in a late part only) counts, though its slot keeps the same bytes
    sizes = ops["comm_size"].combine_chunks()
    valid = np.asarray(sizes.is_valid())
    mask = ~valid
    mask[np.flatnonzero(valid)[-1]] = True  # the last valid value becomes null, its bytes kept
    nulled = pa.array(sizes.fill_null(0).to_numpy(), type=sizes.type, mask=mask)
    assert nulled.null_count == sizes.null_count + 1
    changed = trace.replace(ops=ops.set_column(ops.column_names.index("comm_size"), "comm_size", nulled))
    assert _digest_of(rank_parts(changed, [4]), str(trace.kind)) != whole
    assert content_hash(trace.replace(kind="expanded")) != whole


def test_parts_must_share_the_schema(custom_allreduce: Path) -> None:
    trace = read_et(custom_allreduce)
    a, b = rank_parts(trace, [4])
    d = ContentDigest(str(trace.kind))
    d.update(a)
    with pytest.raises(ValueError, match="another schema"):
        d.update(b.replace(meta=pa.table({"rank": pa.array([], pa.int64())})))
