"""Tuner configs out: which choice wins per size bucket, and the NCCL config that applies it.

From a stored tuner run (``tuner_steps``) or a bus-bandwidth sweep (``sweep_points``), the
fastest choice per (topology, collective, ranks, nodes, power-of-two size bucket) by
median time, as ``v_tuner_best`` ranks them (the same buckets and tie order, per ranks
and nodes too), with the runner-up and the margin. The winners become the config of
NCCL's example tuner plugin (:mod:`etstore.formats.tuner_config`): adjacent buckets with
the same winner merge into one size range. A winner NCCL cannot express (a collective the
plugin does not name, an algorithm that is not NCCL's, no protocol) stays in the table
with the reason it is left out of the config: the config never says something the data
did not. docs/measured.md, "Tuner configs out", says what each column means.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from etstore.app.tuner import SIZE_BUCKET_SQL
from etstore.errors import OptionError, UnknownTraceError
from etstore.formats.tuner_config import (
    CONFIG_FIELDS,
    NCCL_ALGORITHMS,
    NCCL_COLLECTIVES,
    NCCL_PROTOCOLS,
    TunerConfigLine,
    format_tuner_config,
    nccl_algorithm,
    nccl_collective,
    nccl_protocol,
)
from etstore.store.warehouse import Warehouse

__all__ = ["BUCKET_COLUMNS", "SWEEP_ALGORITHMS", "TunerChoices", "run_choices", "sweep_choices"]

log = logging.getLogger(__name__)

BUCKET_COLUMNS = (
    "topology",
    "collective",
    "ranks",
    "nodes",
    "size_bucket_bytes",
    "bucket_max_bytes",
    "choice",
    "algorithm",
    "protocol",
    "channels",
    "chunk_bytes",
    "trace",
    "median_time_us",
    "samples",
    "runner_up",
    "runner_up_time_us",
    "margin_us",
    "margin_pct",
    "choices_tried",
    "bucket_samples",
    "nccl_algorithm",
    "nccl_protocol",
    "nccl_channels",
    "config_line",
    "config_min_bytes",
    "config_max_bytes",
    "left_out",
    "note",
)
"""The columns of :attr:`TunerChoices.buckets`, one row per size bucket (docs/measured.md)."""

SWEEP_ALGORITHMS = {"ring": "ring", "native": "ring", "tree": "tree"}
"""A sweep's algorithm (its name before any ``:chunks``) → the NCCL algorithm written for it.

etstore's ``ring`` and ``tree`` generators and ASTRA-sim's native ring share NCCL's
algorithms' names and shapes, not their implementation: the config then says "NCCL's ring
here" because etstore's ring simulated fastest."""

_SAMPLES = {
    "run": f"""SELECT s.topology, s.collective, s.ranks, s.nodes, {SIZE_BUCKET_SQL} AS size_bucket_bytes,
        s.algorithm, s.protocol, s.channels, s.chunk_bytes, coalesce(s.trace, s.algorithm_trace) AS trace,
        s.time_us
        FROM tuner_steps s WHERE s.run_id = $id""",
    "sweep": f"""SELECT s.topology, s.collective, s.num_npus AS ranks, NULL::INTEGER AS nodes,
        {SIZE_BUCKET_SQL} AS size_bucket_bytes, s.algorithm, NULL::VARCHAR AS protocol,
        NULL::INTEGER AS channels, NULL::BIGINT AS chunk_bytes, NULL::VARCHAR AS trace,
        s.time_ns / 1e3 AS time_us
        FROM sweep_points s WHERE s.sweep_id = $id""",
}

# the two fastest choices per bucket, ranked as v_tuner_best ranks them
_RANKED = """
WITH samples AS ({samples}),
per_choice AS (
    SELECT topology, collective, ranks, nodes, size_bucket_bytes, algorithm, protocol, channels,
        chunk_bytes, trace, count(*) AS samples, median(time_us) AS median_time_us
    FROM samples WHERE $topology IS NULL OR topology = $topology GROUP BY ALL),
ranked AS (
    SELECT *, row_number() OVER (bucket ORDER BY median_time_us, algorithm, protocol, channels,
            chunk_bytes, trace) AS place,
        count(*) OVER bucket AS choices_tried, sum(samples) OVER bucket AS bucket_samples
    FROM per_choice
    WINDOW bucket AS (PARTITION BY topology, collective, ranks, nodes, size_bucket_bytes))
SELECT * FROM ranked WHERE place <= 2
ORDER BY topology NULLS FIRST, collective, ranks NULLS FIRST, nodes NULLS FIRST, size_bucket_bytes, place
"""

_ORIGIN = "NCCL example tuner plugin config (NVIDIA/nccl plugins/tuner/example), written by etstore tuner"


@dataclass(frozen=True)
class TunerChoices:
    """The winners per size bucket and the config lines that apply them."""

    source: dict[str, Any]
    """Where they come from: ``kind`` (``tuner run`` / ``sweep``), ``id``, ``name``, ``topology``
    (the filter, or None) and ``protocol`` (given for a sweep, or None)."""
    buckets: list[dict[str, Any]]
    """One row per bucket, columns :data:`BUCKET_COLUMNS`."""
    config: list[TunerConfigLine]
    """The config lines, in file order (``line`` is each one's line in :meth:`config_text`)."""
    comments: list[str]
    """The config file's leading comments."""

    def config_text(self) -> str:
        """The example plugin's config file (:func:`~etstore.formats.tuner_config.format_tuner_config`)."""
        return format_tuner_config(self.config, comments=self.comments)

    def left_out(self) -> list[dict[str, Any]]:
        """The buckets whose winner the config does not hold, each with its ``left_out`` reason."""
        return [b for b in self.buckets if b["left_out"] is not None]

    def document(self) -> dict[str, Any]:
        """The JSON of the same: source, the config lines by the plugin's field names, the buckets."""
        names = CONFIG_FIELDS[:8]
        return {
            "source": self.source,
            "fields": list(names),
            "config": [{"line": c.line, **dict(zip(names, _typed(c), strict=True))} for c in self.config],
            "buckets": self.buckets,
        }


def _typed(c: TunerConfigLine) -> tuple[Any, ...]:
    """The first 8 fields with their types (numbers as numbers)."""
    return (c.collective, c.min_bytes, c.max_bytes, c.algorithm, c.protocol, c.channels, c.nodes, c.ranks)


def run_choices(warehouse: Warehouse, run: str | int, *, topology: str | None = None) -> TunerChoices:
    """The winning choice per size bucket of tuner run ``run``, and its NCCL config.

    Parameters
    ----------
    warehouse
        The warehouse holding ``tuner_runs`` and ``tuner_steps``.
    run
        The run's name, or its ``run_id`` when no run has that name.
    topology
        Only the steps of this ``topology`` (needed for a config when the run holds several
        for one collective, ranks and nodes: the plugin cannot tell them apart).

    Returns
    -------
    TunerChoices
        A choice is (``algorithm``, ``protocol``, ``channels``, ``chunk_bytes``, ``trace``),
        ``trace`` being the stored algorithm the step ran or, where none was linked, the
        ``algorithm_trace`` it logged; times are µs, the median over its steps in the bucket.

    Raises
    ------
    UnknownTraceError
        No tuner run has that name or id.
    OptionError
        ``topology`` is not one of the run's.

    Notes
    -----
    O(steps) in DuckDB, then O(buckets) here.

    Examples
    --------
    >>> import duckdb
    >>> from etstore.app.runs import RUN_TABLES
    >>> from etstore.app.tuner import TUNER_TABLES
    >>> wh = Warehouse(duckdb.connect())
    >>> wh.ensure(RUN_TABLES); wh.ensure(TUNER_TABLES)
    >>> wh.execute("INSERT INTO tuner_runs (run_id, name, content_hash) VALUES (1, 't', 'h')")
    >>> wh.execute("INSERT INTO tuner_steps (run_id, step, collective, size_bytes, ranks, nodes, "
    ...            "algorithm, protocol, channels, time_us) VALUES (1, 0, 'ALL_REDUCE', 1024, 4, 1, "
    ...            "'Ring', 'LL', 2, 12.0), (1, 1, 'ALL_REDUCE', 1024, 4, 1, 'Tree', 'LL', 2, 10.0)")
    >>> got = run_choices(wh, "t")
    >>> [(b["choice"], b["runner_up"], b["margin_pct"]) for b in got.buckets]
    [('Tree/LL/2ch', 'Ring/LL/2ch', 20.0)]
    >>> got.config_text().splitlines()[-1]
    'allreduce,1024,2047,tree,ll,2,1,4'
    """
    row = _one(
        warehouse,
        "SELECT run_id AS id, name FROM tuner_runs WHERE name = $n OR (NOT EXISTS "
        "(SELECT 1 FROM tuner_runs WHERE name = $n) AND CAST(run_id AS VARCHAR) = $n)",
        {"n": str(run)},
        f"no tuner run {str(run)!r} (SELECT run_id, name FROM tuner_runs lists them)",
    )
    source = {"kind": "tuner run", "id": int(row["id"]), "name": str(row["name"]), "topology": topology}
    return _choices(warehouse, "run", {**source, "protocol": None})


def sweep_choices(
    warehouse: Warehouse, sweep: str | int, *, topology: str | None = None, protocol: str | None = None
) -> TunerChoices:
    """The winning algorithm per size bucket of bus-bandwidth sweep ``sweep``, and its NCCL config.

    A simulation has no NCCL protocol and no channels: each winner is an algorithm alone, and
    its config line needs ``protocol`` given (else it is left out); channels are -1. Only
    the algorithms in :data:`SWEEP_ALGORITHMS` have an NCCL name.

    Parameters
    ----------
    warehouse
        The warehouse holding ``sweep_points``.
    sweep
        The sweep's id.
    topology
        Only the points of this topology spec.
    protocol
        The NCCL protocol every config line of the sweep's winners gets (``ll``,
        ``ll128``, ``simple``; any spelling :func:`~etstore.formats.tuner_config.nccl_protocol`
        reads).

    Raises
    ------
    UnknownTraceError
        No sweep has that id.
    OptionError
        ``sweep`` is not an integer, ``topology`` is not one of the sweep's, ``protocol``
        is not NCCL's.

    Notes
    -----
    O(points) in DuckDB, then O(buckets) here.
    """
    try:
        sweep_id = int(sweep)
    except ValueError:
        raise OptionError(f"sweep {sweep!r}: a sweep is named by its id, an integer") from None
    given = None
    if protocol is not None:
        given = nccl_protocol(protocol)
        if given is None:
            raise OptionError(f"protocol {protocol!r} is not NCCL's: one of {', '.join(NCCL_PROTOCOLS)}")
    _one(
        warehouse,
        "SELECT sweep_id AS id FROM sweep_points WHERE sweep_id = $n LIMIT 1",
        {"n": sweep_id},
        f"no sweep {sweep_id} (SELECT DISTINCT sweep_id, topology FROM sweep_points lists them)",
    )
    source = {"kind": "sweep", "id": sweep_id, "name": f"sweep {sweep_id}", "topology": topology}
    return _choices(warehouse, "sweep", {**source, "protocol": given})


def _one(warehouse: Warehouse, sql: str, params: Mapping[str, Any], missing: str) -> dict[str, Any]:
    rows = warehouse.query(sql, params).to_pylist()
    if not rows:
        raise UnknownTraceError(missing)
    return dict(rows[0])


def _choices(warehouse: Warehouse, kind: str, source: dict[str, Any]) -> TunerChoices:
    """Rank, decide what the config can say, merge: the whole computation for either source."""
    samples = _SAMPLES[kind]
    topology = source["topology"]
    if topology is not None:
        present = warehouse.query(
            f"SELECT DISTINCT topology FROM ({samples}) ORDER BY topology", {"id": source["id"]}
        ).to_pylist()
        names = [r["topology"] for r in present if r["topology"] is not None]
        if topology not in names:
            raise OptionError(
                f"{source['name']} has no topology {topology!r} (it has: {', '.join(names) or 'none named'})"
            )
    ranked = warehouse.query(
        _RANKED.format(samples=samples), {"id": source["id"], "topology": topology}
    ).to_pylist()
    buckets = [_bucket(first, second, kind, source["protocol"]) for first, second in _pairs(ranked)]
    _refuse_mixed_topologies(buckets)
    comments = [
        _ORIGIN,
        _origin_line(source),
        "the first matching line applies; other sizes are NCCL's own choice",
    ]
    config = _merged(buckets, first_line=len(comments) + 2)
    log.debug("%s: %d buckets, %d config lines", source["name"], len(buckets), len(config))
    return TunerChoices(source, buckets, config, comments)


def _origin_line(source: Mapping[str, Any]) -> str:
    where = f" on topology {source['topology']}" if source["topology"] is not None else ""
    if source["kind"] == "sweep":
        proto = source["protocol"]
        given = f"protocol {proto} given with --protocol" if proto else "no protocol given"
        return f"from simulated sweep {source['id']}{where} ({given})"
    return f"from tuner run {source['name']!r} (run_id {source['id']}){where}"


def _pairs(
    ranked: Sequence[Mapping[str, Any]],
) -> Iterator[tuple[Mapping[str, Any], Mapping[str, Any] | None]]:
    """Each bucket's winner with its runner-up (None when one choice was tried)."""
    for i, row in enumerate(ranked):
        if row["place"] == 1:
            nxt = ranked[i + 1] if i + 1 < len(ranked) and ranked[i + 1]["place"] == 2 else None
            yield row, nxt


def _label(row: Mapping[str, Any]) -> str:
    """A choice in a few characters: ``Ring/LL128/4ch``, ``ring_allreduce_4r/Simple/2ch`` (a stored
    algorithm's name stands in for a missing algorithm; a linked one is in the ``trace`` column)."""
    name = row["algorithm"] or row["trace"] or "?"
    parts = [str(name)]
    if row["protocol"]:
        parts.append(str(row["protocol"]))
    if row["channels"] is not None:
        parts.append(f"{row['channels']}ch")
    if row["chunk_bytes"] is not None:
        parts.append(f"chunk {row['chunk_bytes']}")
    return "/".join(parts)


def _bucket(
    first: Mapping[str, Any], second: Mapping[str, Any] | None, kind: str, protocol: str | None
) -> dict[str, Any]:
    """One bucket's row: the winner, the runner-up and margin, and what the config can say of it."""
    low = int(first["size_bucket_bytes"])
    best = float(first["median_time_us"])
    runner = None if second is None else float(second["median_time_us"])
    algorithm, proto, reason = _expressed(first, kind, protocol)
    note = None
    if reason is None and first["chunk_bytes"] is not None:
        note = f"chunk_bytes {first['chunk_bytes']} not written: the config has no chunk size"
    return {
        "topology": first["topology"],
        "collective": first["collective"],
        "ranks": first["ranks"],
        "nodes": first["nodes"],
        "size_bucket_bytes": low,
        "bucket_max_bytes": 2 * low - 1 if low else 0,
        "choice": _label(first),
        "algorithm": first["algorithm"],
        "protocol": first["protocol"],
        "channels": first["channels"],
        "chunk_bytes": first["chunk_bytes"],
        "trace": first["trace"],
        "median_time_us": best,
        "samples": int(first["samples"]),
        "runner_up": None if second is None else _label(second),
        "runner_up_time_us": runner,
        "margin_us": None if runner is None else runner - best,
        "margin_pct": None if runner is None or best <= 0 else 100 * (runner - best) / best,
        "choices_tried": int(first["choices_tried"]),
        "bucket_samples": int(first["bucket_samples"]),
        "nccl_algorithm": algorithm if reason is None else None,
        "nccl_protocol": proto if reason is None else None,
        "nccl_channels": None if reason is not None else _channels(first),
        "config_line": None,
        "config_min_bytes": None,
        "config_max_bytes": None,
        "left_out": reason,
        "note": note,
    }


def _channels(row: Mapping[str, Any]) -> int:
    """The config's channels: the logged ones, or -1 (the plugin's default) when none were."""
    return -1 if row["channels"] is None else int(row["channels"])


def _expressed(
    row: Mapping[str, Any], kind: str, protocol: str | None
) -> tuple[str | None, str | None, str | None]:
    """The winner's NCCL algorithm and protocol, or the reason the config cannot hold it."""
    coll = row["collective"]
    if nccl_collective(str(coll)) is None:
        return (
            None,
            None,
            (
                f"the plugin has no collective {coll} (it names {', '.join(NCCL_COLLECTIVES)}; any other "
                "name it reads as allreduce)"
            ),
        )
    algo = row["algorithm"]
    if kind == "sweep":
        alg = SWEEP_ALGORITHMS.get(str(algo).split(":", 1)[0])
        if alg is None:
            return (
                None,
                None,
                (
                    f"etstore's {algo!r} has no NCCL algorithm (a sweep's ring, native and tree are written "
                    "as NCCL's ring, ring and tree)"
                ),
            )
        if protocol is None:
            return alg, None, "a simulation models no NCCL protocol: give --protocol to write it"
        return alg, protocol, None
    if algo is None:
        trace = row["trace"]
        what = f"ran algorithm trace {trace!r}, not an NCCL algorithm" if trace else "logged no algorithm"
        return None, None, f"the choice {what}"
    alg = nccl_algorithm(str(algo))
    if alg is None:
        return None, None, f"{algo!r} is not an NCCL algorithm ({', '.join(NCCL_ALGORITHMS)})"
    if row["protocol"] is None:
        return alg, None, "no protocol logged: NCCL takes an algorithm only with a protocol"
    proto = nccl_protocol(str(row["protocol"]))
    if proto is None:
        return alg, None, f"{row['protocol']!r} is not an NCCL protocol ({', '.join(NCCL_PROTOCOLS)})"
    return alg, proto, None


def _group(b: Mapping[str, Any]) -> tuple[str | None, Any, Any]:
    """What a config line can tell calls apart by: the plugin's collective, nodes and ranks."""
    return nccl_collective(str(b["collective"])), b["nodes"], b["ranks"]


def _refuse_mixed_topologies(buckets: list[dict[str, Any]]) -> None:
    """Leave out the buckets of groups the data holds for several topologies: their lines would
    contradict each other and the plugin would apply whichever comes first."""
    seen: dict[tuple[Any, ...], set[Any]] = {}
    for b in buckets:
        if b["left_out"] is None:
            seen.setdefault(_group(b), set()).add(b["topology"])
    for b in buckets:
        topologies = seen.get(_group(b), set())
        if b["left_out"] is None and len(topologies) > 1:
            named = ", ".join(sorted(str(t) for t in topologies))
            b["left_out"] = (
                f"the data holds topologies {named} for this collective, nodes and ranks, which the "
                "plugin cannot tell apart: choose one with --topology"
            )
            b["nccl_algorithm"] = b["nccl_protocol"] = b["nccl_channels"] = None
            b["note"] = None


def _merged(buckets: list[dict[str, Any]], *, first_line: int) -> list[TunerConfigLine]:
    """The config lines: adjacent buckets of a group with one NCCL choice merged into one range,
    lines with known nodes and ranks before wildcards (the first match wins); each bucket
    row is told its line."""
    lines: list[tuple[TunerConfigLine, list[dict[str, Any]]]] = []
    kept = sorted(
        (b for b in buckets if b["left_out"] is None),
        key=lambda b: (str(_group(b)), b["size_bucket_bytes"]),
    )
    for b in kept:
        coll, nodes, ranks = _group(b)
        what = (b["nccl_algorithm"], b["nccl_protocol"], b["nccl_channels"])
        if lines:
            last, members = lines[-1]
            prev = members[-1]
            step = 2 * prev["size_bucket_bytes"] or 1
            same = _group(prev) == _group(b) and (last.algorithm, last.protocol, last.channels) == what
            if same and b["size_bucket_bytes"] == step:
                lines[-1] = (last._replace(max_bytes=b["bucket_max_bytes"]), [*members, b])
                continue
        line = TunerConfigLine(
            str(coll),
            b["size_bucket_bytes"],
            b["bucket_max_bytes"],
            str(what[0]),
            str(what[1]),
            int(what[2]),
            -1 if nodes is None else int(nodes),
            -1 if ranks is None else int(ranks),
        )
        lines.append((line, [b]))
    lines.sort(
        key=lambda lm: (
            NCCL_COLLECTIVES.index(lm[0].collective),
            (lm[0].nodes == -1) + (lm[0].ranks == -1),
            lm[0].nodes,
            lm[0].ranks,
            lm[0].min_bytes,
        )
    )
    out = []
    for i, (line, members) in enumerate(lines):
        placed = line._replace(line=first_line + i)
        out.append(placed)
        for b in members:
            b.update(
                config_line=placed.line, config_min_bytes=placed.min_bytes, config_max_bytes=placed.max_bytes
            )
    return out
