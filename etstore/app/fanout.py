"""Independent pieces of work fanned out: in this process, or as Ray tasks on a cluster.

A sweep's points, a what-if grid's values or a batch of rank files are independent: each is a
pure function of its item and of what the points share (a trace, a topology). :func:`fanout`
opens an executor whose :meth:`Fanout.map` runs ``fn(item, shared)`` for every item and gives
the results back in the items' order, so a caller writes one loop for both engines and the
results are the same, bit for bit, whichever ran them. A piece that raises does not stop the
rest: its slot holds a :class:`Failed` with one line saying why.

Ray (``pip install 'etstore[ray]'``) is imported only when asked for. ``ray="local"`` starts a
Ray instance on this machine for the duration (or joins the one ``$RAY_ADDRESS`` names),
``"auto"`` joins the cluster already running here (``ray start --head``), anything else is a
cluster address (``host:6379`` or ``ray://host:10001``). Items are sent in batches of a few
per task, so Ray's per-task cost (about a millisecond) is paid per batch; what the items share
is put in Ray's object store once. Results come back to the driver, which alone records
them, so a task Ray retries after a worker died can never record twice.
"""

from __future__ import annotations

import collections
import functools
import hashlib
import itertools
import logging
import math
import os
import re
import socket
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

from etstore.errors import EtstoreError, OptionError
from etstore.progress import CountFn

__all__ = ["Failed", "Fanout", "failures", "fanout"]

log = logging.getLogger(__name__)


PieceFn = Callable[[Any, Any], Any]
"""``fn(item, shared) -> result``: one piece of work; must be picklable for Ray (module level)."""


_TASKS_PER_WORKER = 4  # batches per worker: enough to even out slow items, few enough to amortise


@dataclass(frozen=True)
class Failed:
    """A piece that raised: the item's position in the input and one line saying why."""

    index: int
    message: str

    def __str__(self) -> str:
        return self.message


def failures(results: Sequence[object]) -> list[Failed]:
    """The :class:`Failed` slots of ``results``, in order.

    >>> failures([1, Failed(1, "boom"), 3])
    [Failed(index=1, message='boom')]
    """
    return [r for r in results if isinstance(r, Failed)]


def _one_line(exc: BaseException) -> str:
    """An exception as one line: its message, led by its class unless it is one of ours."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if isinstance(exc, EtstoreError) else f"{type(exc).__name__}: {text}"


def _run_batch(fn: PieceFn, shared: Any, batch: Sequence[tuple[int, Any]]) -> list[tuple[int, Any]]:
    """``fn(item, shared)`` for each ``(index, item)``; a raising item yields a :class:`Failed`.

    Interrupts propagate; any other exception is the item's failure, so one bad point of a
    long sweep costs that point only.
    """
    out: list[tuple[int, Any]] = []
    for index, item in batch:
        try:
            out.append((index, fn(item, shared)))
        except Exception as exc:  # reported per item, the rest go on
            out.append((index, Failed(index, _one_line(exc))))
    return out


def _batches(n: int, workers: int) -> list[range]:
    """``range(n)`` dealt into about :data:`_TASKS_PER_WORKER` batches per worker, every k-th
    item to one batch, so neighbouring items (a sweep's heavier cells sit together) spread
    across workers.

    >>> [list(b) for b in _batches(5, 1)]
    [[0, 3], [1, 4], [2]]
    >>> len(_batches(0, 4))
    0
    """
    if n == 0:
        return []
    count = min(n, max(1, workers) * _TASKS_PER_WORKER)
    size = math.ceil(n / count)
    count = math.ceil(n / size)
    return [range(k, n, count) for k in range(count)]


@dataclass
class Fanout:
    """An open executor: :meth:`map` runs pieces here (``engine == "serial"``) or on Ray.

    ``workers`` is how many pieces can run at once (1 here; the cluster's CPUs on Ray);
    ``where`` says in words where they run, for a progress line.
    """

    engine: str
    workers: int
    where: str

    def map(
        self,
        fn: PieceFn,
        items: Sequence[Any],
        *,
        shared: Any = None,
        progress: CountFn | None = None,
    ) -> list[Any]:
        """``fn(item, shared)`` for each item, results in the items' order.

        Parameters
        ----------
        fn
            A module-level function (Ray pickles it by reference on the workers).
        items
            The pieces' inputs.
        shared
            What every piece reads (a trace, a config): sent once, not per item.
        progress
            Called on this thread as items finish.

        Returns
        -------
        list
            One slot per item: its result, or a :class:`Failed`.

        Notes
        -----
        O(len(items)) calls of ``fn``; on Ray about ``4 × workers`` tasks.
        """
        if self.engine == "serial":
            out: list[Any] = []
            for i, item in enumerate(items):
                out.extend(r for _, r in _run_batch(fn, shared, [(i, item)]))
                if progress is not None:
                    progress(i + 1, len(items))
            return out
        return _ray_map(fn, items, shared, self.workers, progress)

    def stream(
        self, fn: PieceFn, items: Iterable[Any], *, shared: Any = None, window: int | None = None
    ) -> Iterator[Any]:
        """``fn(item, shared)`` for each item, yielded in the items' order as each is ready, at
        most ``window`` pieces in flight (default two per worker), so what is held at once is a
        window of results, not all of them (rank files decoded for a streamed ingest).

        Raises
        ------
        Exception
            The first piece that raises, as it raised (later pieces are cancelled): a stream
            feeds one all-or-nothing result.
        """
        if self.engine == "serial":
            for item in items:
                yield fn(item, shared)
            return
        yield from _ray_stream(fn, items, shared, window or 2 * self.workers)

    def ordered_map(self, fn: Callable[[Any], Any], items: Iterable[Any]) -> Iterator[Any]:
        """``fn(item)`` for each item in order, as the builtin ``map`` gives it, run by this
        executor (:meth:`stream`): the shape a reader's ``map_fn`` hook takes
        (:func:`etstore.formats.et_parts.read_et_parts`).

        >>> with fanout() as fan:
        ...     list(fan.ordered_map(abs, [-1, 2, -3]))
        [1, 2, 3]
        """
        return self.stream(_apply, items, shared=fn)


def _apply(item: Any, fn: Callable[[Any], Any]) -> Any:
    return fn(item)


def _run_one(fn: PieceFn, shared: Any, item: Any) -> tuple[bool, Any]:
    """``(True, fn(item, shared))``, or ``(False, the exception)`` to raise on the driver as it is."""
    try:
        return True, fn(item, shared)
    except Exception as exc:  # re-raised by the driver, with its own class
        return False, exc


def _ray_stream(fn: PieceFn, items: Iterable[Any], shared: Any, window: int) -> Iterator[Any]:
    """:meth:`Fanout.stream` on Ray: one task per item, a sliding window of them in flight."""
    import ray  # optional: only --ray loads it

    remote = ray.remote(_run_one)
    fn_ref, shared_ref = ray.put(fn), ray.put(shared)
    it = iter(items)
    pending = collections.deque(
        remote.remote(fn_ref, shared_ref, item) for item in itertools.islice(it, window)
    )
    try:
        while pending:
            ok, value = ray.get(pending.popleft())
            if not ok:
                raise value
            for item in itertools.islice(it, 1):
                pending.append(remote.remote(fn_ref, shared_ref, item))
            yield value
    finally:
        for ref in pending:
            ray.cancel(ref)


def _ray_map(
    fn: PieceFn, items: Sequence[Any], shared: Any, workers: int, progress: CountFn | None
) -> list[Any]:
    """:meth:`Fanout.map` on Ray: batches as tasks, collected as they finish."""
    import ray  # optional: only --ray loads it

    remote = ray.remote(_run_batch)
    fn_ref, shared_ref = ray.put(fn), ray.put(shared)
    pending: dict[Any, range] = {}
    for batch in _batches(len(items), workers):
        ref = remote.remote(fn_ref, shared_ref, [(i, items[i]) for i in batch])
        pending[ref] = batch
    out: list[Any] = [None] * len(items)
    done = 0
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=1)
        for ref in ready:
            batch = pending.pop(ref)
            try:
                for index, result in ray.get(ref):
                    out[index] = result
            except ray.exceptions.RayError as exc:  # the task itself died (worker lost, OOM kill)
                why = _ray_reason(exc)
                for index in batch:
                    out[index] = Failed(index, f"Ray task failed: {why}")
            done += len(batch)
            if progress is not None:
                progress(done, len(items))
    return out


@functools.cache
def _code() -> str:
    """etstore's version and a digest of its sources (Python and C): what makes two runs agree bit for bit.

    A version number alone would let a worker with local edits (or another commit of the same
    version) answer differently; the digest costs about 10 ms once per process.
    """
    root = Path(__file__).resolve().parents[1]
    digest = hashlib.blake2b(digest_size=8)
    for path in sorted(p for p in root.rglob("*") if p.suffix in (".py", ".c", ".h")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return f"{version('etstore')} ({digest.hexdigest()})"


def _ray_reason(exc: BaseException) -> str:
    """Ray's error as one short line: its class and the first line of its message, uncoloured."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc)).strip().splitlines()
    first = text[0][:200] if text else ""
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def _version(_item: Any, _shared: Any) -> str:
    """What :func:`_code` says on a worker."""
    return _code()


@contextmanager
def fanout(ray: str | None = None) -> Iterator[Fanout]:
    """An executor for independent pieces: this process (``ray=None``), or Ray.

    Parameters
    ----------
    ray
        ``None``: run here, one piece after another. ``"local"``: a Ray instance on this
        machine, started for the duration (or the cluster ``$RAY_ADDRESS`` names).
        ``"auto"``: the cluster already running on this machine. Else a cluster address.

    Raises
    ------
    OptionError
        Ray is not installed, or the address cannot be reached, or the cluster's workers run
        another etstore version (their results could differ from this one's).

    Examples
    --------
    >>> with fanout() as fan:
    ...     fan.map(lambda x, k: x * k, [1, 2, 3], shared=10)
    [10, 20, 30]
    """
    if ray is None:
        yield Fanout("serial", 1, "this process")
        return
    mod = _import_ray()
    started_here = not mod.is_initialized()
    if started_here:
        _connect(mod, ray)
    try:
        workers = max(1, int(mod.cluster_resources().get("CPU", 1)))
        nodes = sum(1 for n in mod.nodes() if n.get("Alive"))
        fan: Fanout = Fanout("ray", workers, f"Ray: {nodes} node(s), {workers} CPU(s)")
        _check_versions(fan)
        yield fan
    finally:
        if started_here:
            mod.shutdown()


def _import_ray() -> Any:
    try:
        import ray  # optional: only --ray loads it
    except ImportError as exc:
        raise OptionError("--ray needs Ray: pip install 'etstore[ray]'") from exc
    return ray


def _probe(address: str, timeout_s: float = 5.0) -> None:
    """Refuse an address nothing listens on, at once: Ray itself retries such a one for minutes.

    Raises
    ------
    OptionError
        No TCP connection to the address's host and port within ``timeout_s``.
    """
    where = address.split("://", 1)[-1]
    host, _, port = where.rpartition(":")
    if not host or not port.isdigit():
        host, port = where, "6379"  # Ray's default head port
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            pass
    except OSError as exc:
        why = exc.strerror or type(exc).__name__
        raise OptionError(f"--ray {address}: cannot reach a Ray cluster: {why} at {host}:{port}") from exc


def _connect(mod: Any, address: str) -> None:
    """Join or start a Ray cluster, quietly (no dashboard, workers' logs kept off the terminal)."""
    named = os.environ.get("RAY_ADDRESS", "") if address == "local" else address
    if named not in ("", "local", "auto"):
        _probe(named)
    t0 = time.perf_counter()
    quiet = logging.getLogger("ray")
    level, quiet.level = quiet.level, logging.ERROR  # its banner lines are not the command's output
    try:
        mod.init(
            address=None if address == "local" else address,
            include_dashboard=False,
            log_to_driver=False,
            logging_level=logging.WARNING,
            configure_logging=False,
        )
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise OptionError(f"--ray {address}: cannot reach a Ray cluster: {_one_line(exc)}") from exc
    finally:
        quiet.setLevel(level)
    log.info("Ray %s joined in %.2f s", address, time.perf_counter() - t0)


def _check_versions(fan: Fanout) -> None:
    """Refuse workers running another etstore: the same inputs could give other results."""
    seen = {v for v in fan.map(_version, [None] * fan.workers) if not isinstance(v, Failed)}
    other = seen - {_code()}
    if other:
        raise OptionError(
            f"Ray workers run etstore {', '.join(sorted(other))}, this driver {_code()}: "
            "install the same etstore on every node"
        )
