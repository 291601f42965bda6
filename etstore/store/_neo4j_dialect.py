"""Neo4j's side of the dialect: Ladybug spellings translated, driver values made plain."""

from __future__ import annotations

import json
import logging
import re
from typing import Any

import pyarrow as pa

from etstore.store.graph import GRAPH_OP_COLUMNS, TRACE_NODE_COLUMNS

__all__ = ["column", "driver", "message", "plain", "translate_cypher"]

# the driver logs connection failures itself; etstore reports them as one line instead
logging.getLogger("neo4j").setLevel(logging.CRITICAL)


_REL_VAR = re.compile(r"-\[\s*([A-Za-z_][A-Za-z0-9_]*)")
_LABEL_CALL = re.compile(r"\blabel\s*\(\s*([A-Za-z_][A-Za-z0-9_]*)\s*\)", re.IGNORECASE)
_STRINGS = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|`[^`]*`")


def translate_cypher(query: str) -> str:
    """Rewrite the Ladybug spellings etstore documents into Neo4j's, outside string literals.

    ``label(r)`` of a relationship variable becomes ``type(r)``; ``label(n)`` of a
    node becomes ``head(labels(n))``. Everything else passes through unchanged.
    """
    pieces: list[str] = []
    last = 0
    rels = set(_REL_VAR.findall(_STRINGS.sub("''", query)))

    def fix(segment: str) -> str:
        return _LABEL_CALL.sub(
            lambda m: f"type({m[1]})" if m[1] in rels else f"head(labels({m[1]}))", segment
        )

    for m in _STRINGS.finditer(query):
        pieces.append(fix(query[last : m.start()]))
        pieces.append(m[0])
        last = m.end()
    pieces.append(fix(query[last:]))
    return "".join(pieces)


def driver() -> Any:
    """The ``neo4j`` driver package."""
    import neo4j  # about a second to import: only server readers and publishes pay for it, on first use

    return neo4j


def plain(value: Any) -> Any:
    """A driver value as plain Python: nodes and relationships become dicts, temporals native."""
    graph = driver().graph
    if isinstance(value, graph.Node):
        labels = sorted(value.labels)
        out: dict[str, Any] = {"_ID": value.element_id, "_LABEL": labels[0] if labels else None}
        # every column of the node's table, absent (null) ones too, as the embedded store gives them
        if "Op" in value.labels:
            out.update({c: value.get(c) for c in GRAPH_OP_COLUMNS})
        elif "Trace" in value.labels:
            out.update({c: value.get(c) for c in TRACE_NODE_COLUMNS})
        out.update({k: plain(v) for k, v in value.items() if k not in out})
        return out
    if isinstance(value, graph.Relationship):
        rel: dict[str, Any] = {
            "_SRC": value.start_node.element_id if value.start_node is not None else None,
            "_DST": value.end_node.element_id if value.end_node is not None else None,
            "_LABEL": value.type,
            "_ID": value.element_id,
        }
        rel.update({k: plain(v) for k, v in value.items()})
        return rel
    if isinstance(value, graph.Path):
        return {"_NODES": [plain(n) for n in value.nodes], "_RELS": [plain(r) for r in value.relationships]}
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if hasattr(value, "to_native"):
        return value.to_native()
    return value


def column(values: list[Any]) -> pa.Array:
    try:
        return pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError):  # mixed types in one column: keep them readable
        return pa.array([None if v is None else json.dumps(v, default=str) for v in values], pa.string())


def message(exc: BaseException) -> str:
    text = str(getattr(exc, "message", None) or exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
