"""Simulator benchmarks: simulated events per second, and the published bus-bandwidth sweep.

Prints one JSON line per measurement: ``{"metric", "value", "unit", "n", "machine", ...}``.
Budget (DESIGN.md): >= 1M simulated events/s. Anchor: ASTRA-sim (C++) replays a
64-rank ring all-reduce of 20,160 send/recv/compute nodes in 0.2-0.4 s here.

When ASTRA-sim's analytical binaries are present (``/work/astra-build/bin``, or the
directory in ``$ASTRA_SIM_BIN``; bench/README.md says how they were built), the
``etstore workload --tp 8 --layers 8`` transformer at 64 and 256 ranks (``--astra-ranks``)
is exported once (``.et`` files + comm-group JSON) and run by both tools as separate
processes on the same files (ring of 50 GB/s, 500 ns links; rt_template's system config
with local-mem-bw 1600): makespans, their ratio, wall time and peak RSS of each, medians
of ``--repeat`` runs. etstore runs twice over: the library calls (``ETSTORE_RUN``) and the
``etstore sim`` command a user types (``ETSTORE_CLI``), both with bytecode cached.

Events are the items the event loop processes: an op finishing, or a message
arriving (plus one per link hop with the congestion-aware model). ``events_per_s``
uses the CPU time of the loop alone (``time.process_time``, robust to other
processes on a shared machine); ``wall_s`` is the whole ``simulate`` call,
preparation and metrics included.

Usage::

    python bench/bench_sim.py                # everything
    python bench/bench_sim.py --skip-sweep   # events/s only
    python bench/bench_sim.py --ops 200000   # a smaller synthetic workload
    python bench/bench_sim.py --astra-only --astra-ranks 64,256,1024   # ASTRA-sim vs etstore only
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from etstore.algorithms.generators import generate
from etstore.model import Trace, deps_table, ops_table
from etstore.sim import SimConfig, collective_workload, simulate, sweep
from etstore.topology import Topology

PY = f"{platform.python_implementation()} {platform.python_version()}"
MACHINE = f"{platform.machine()} {os.cpu_count()} cpu, {PY}"
SHARED = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "astra-sim"
ASTRA_BIN = Path(os.environ.get("ASTRA_SIM_BIN", "/work/astra-build/bin"))
GNU_TIME = Path("/usr/bin/time")
ASTRA_BINARY = {
    "unaware": "AstraSim_Analytical_Congestion_Unaware",
    "aware": "AstraSim_Analytical_Congestion_Aware",
}
# etstore in its own process, as ASTRA-sim runs: read the exported files, simulate, print the makespan
ETSTORE_RUN = """
import dataclasses, sys
from etstore.formats.et import read_et
from etstore.sim import read_comm_groups, read_network_config, read_system_config, simulate
prefix, groups, system, network, congestion = sys.argv[1:6]
net = read_network_config(network)
cfg = dataclasses.replace(read_system_config(system), congestion=congestion)
res = simulate(read_et(prefix), net.topology, config=cfg, groups=read_comm_groups(groups), dims=net.dims)
print(int(res.total_ns), res.wall_s)
"""
# the same run as a user types it: `etstore sim` on the exported files, nothing recorded
ETSTORE_CLI = [
    "-m", "etstore.cli", "--store", "{store}", "sim", "{prefix}", "--network-config", "{network}",
    "--system-config", "{system}", "--comm-groups", "{groups}", "--congestion", "{congestion}",
    "--no-record", "--format", "json",
]  # fmt: skip


def emit(metric: str, value: float, unit: str, n: int, **extra: object) -> None:
    print(
        json.dumps({"metric": metric, "value": value, "unit": unit, "n": n, "machine": MACHINE, **extra}),
        flush=True,
    )


def expanded_allreduce(n: int = 64, size: int = 64 << 20) -> Trace:
    """The ring all-reduce as plain send/recv/compute nodes: 5(n-1) nodes per rank (20,160 at n=64)."""
    alg = generate("ring", coll="allreduce", ranks=n)
    col = alg.ops.schema.get_field_index("comm_size")
    ops = alg.ops.set_column(col, "comm_size", pa.array(np.full(alg.num_ops, size // n), pa.int64()))
    return alg.replace(ops=ops, kind="expanded", name=f"ring-allreduce-{n}-expanded")


def synthetic_workload(ranks: int, blocks: int, seed: int = 0) -> Trace:
    """``ranks × 4·blocks`` ops: per block a compute, a send to the next rank, a receive
    from the previous one and a compute that needs both (a pipeline-parallel pattern)."""
    rng = np.random.default_rng(seed)
    per = 4 * blocks
    r = np.repeat(np.arange(ranks), per)
    local = np.tile(np.arange(per), ranks)
    pos, blk = local % 4, local // 4
    kinds = np.array(["COMP_NODE", "COMM_SEND_NODE", "COMM_RECV_NODE", "COMP_NODE"])[pos]
    dur = np.where(pos == 0, rng.integers(1, 20, len(r)), np.where(pos == 3, rng.integers(1, 5, len(r)), 0))
    comm = (pos == 1) | (pos == 2)
    size = (blk % 16 + 1) << 14

    def opt(values: np.ndarray, mask: np.ndarray, typ: pa.DataType) -> pa.Array:
        return pa.array(values, typ, mask=~mask)

    ops = ops_table(
        {
            "rank": r.astype(np.int32),
            "id": local.astype(np.uint64),
            "type": kinds,
            "duration_micros": dur.astype(np.uint64),
            "comm_dst": opt((r + 1) % ranks, pos == 1, pa.int32()),
            "comm_src": opt((r - 1) % ranks, pos == 2, pa.int32()),
            "comm_tag": opt(blk, comm, pa.int32()),
            "comm_size": opt(size, comm, pa.int64()),
        }
    )
    base = np.arange(ranks * blocks) * 4
    rank_of = base // per
    nxt = (base % per) + 4 < per
    src = np.concatenate([base, base, base + 2, base, (base + 3)[nxt]]) % per
    dst = np.concatenate([base + 1, base + 2, base + 3, base + 3, (base + 4)[nxt]]) % per
    rk = np.concatenate([rank_of, rank_of, rank_of, rank_of, rank_of[nxt]])
    return Trace(ops=ops, deps=deps_table(rk, src, dst), name=f"synthetic-{ranks}x{per}")


def measure(
    name: str, trace: Trace, topo: Topology, config: SimConfig, repeat: int = 3, **kw: object
) -> None:
    """Simulate ``repeat`` times; emit the median events/s and wall (and the run's overloaded links)."""
    walls, rates = [], []
    for _ in range(max(1, repeat)):
        t0 = time.perf_counter()
        res = simulate(trace, topo, config=config, **kw)  # type: ignore[arg-type]
        walls.append(time.perf_counter() - t0)
        rates.append(res.events_per_s)
    wall = statistics.median(walls)
    common = {
        "congestion": config.congestion,
        "ops": trace.num_ops,
        "sim_ops": res.sim_ops,
        "events": res.events,
        "loop_cpu_s": round(res.loop_s, 4),
        "wall_s": round(wall, 4),
        "total_ns": res.total_ns,
        "overloaded_links": res.overloaded.num_rows,
        "repeat": len(walls),
    }
    emit(f"sim.{name}.events_per_s", round(statistics.median(rates)), "events/s", res.events, **common)
    emit(f"sim.{name}.wall_s", round(wall, 4), "s", trace.num_ops, **common)


def kill_group(pid: int) -> None:
    """SIGKILL the process group ``pid`` leads, if it still exists."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def timed_process(
    cmd: list[str], cwd: Path, timeout_s: float, env: dict[str, str] | None = None
) -> tuple[str, float, float]:
    """Run ``cmd``; its output, wall seconds and peak RSS in MiB.

    The peak RSS is GNU time's (``/usr/bin/time``, when present): a child started from this
    process by vfork or fork inherits this process's high-water mark through ``exec``, so
    ``wait4`` would report this process's RSS for any smaller child (ASTRA-sim's ≈ 20 MiB
    as ≈ 150 MiB). Without GNU time it is ``wait4``'s, a bound from above.

    Raises RuntimeError when it fails or runs longer than ``timeout_s`` (it is killed then).
    """
    log = cwd / "run.log"
    rss_file = cwd / "run.rss"
    name = Path(cmd[0]).name
    if GNU_TIME.exists():
        cmd = [str(GNU_TIME), "-f", "%M", "-o", str(rss_file), *cmd]
    t0 = time.perf_counter()
    with log.open("w") as out:  # its own process group, so that a kill reaches GNU time's child too
        proc = subprocess.Popen(
            cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    timer = threading.Timer(timeout_s, kill_group, (proc.pid,))
    timer.start()
    try:
        _, status, usage = os.wait4(proc.pid, 0)
    except BaseException:  # Ctrl-C: the runs do not outlive the benchmark
        kill_group(proc.pid)
        raise
    finally:
        timer.cancel()
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here, so Popen must not wait again
    text = log.read_text(errors="replace")
    if proc.returncode:
        why = "timed out" if wall >= timeout_s else f"exited {proc.returncode}"
        raise RuntimeError(f"{name} {why}: {text.strip().splitlines()[-1:]}")
    if GNU_TIME.exists():
        return text, wall, int(rss_file.read_text().split()[-1]) / 1024  # KiB
    return text, wall, usage.ru_maxrss / 1024


def repeated(
    cmd: list[str], cwd: Path, timeout_s: float, repeat: int, env: dict[str, str] | None = None
) -> tuple[str, float, float]:
    """:func:`timed_process` ``repeat`` times: the last output, the median wall, the largest peak RSS."""
    runs = [timed_process(cmd, cwd, timeout_s, env) for _ in range(max(1, repeat))]
    return runs[-1][0], statistics.median(r[1] for r in runs), max(r[2] for r in runs)


def installed_env(cache: Path) -> dict[str, str]:
    """This environment, with bytecode cached (in ``cache``) as an installed package has it.

    Compiling every module of the package again on each run (``PYTHONDONTWRITEBYTECODE``,
    set on some development machines) would add ≈ 0.2 s to each etstore process.
    """
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(cache)
    return env


def astra_makespan_ns(out: str) -> float:
    """The largest ``sys[r] finished, T cycles`` of ASTRA-sim's log (1 cycle = 1 ns)."""
    import re  # only this comparison parses ASTRA-sim's log

    ends = [int(m) for m in re.findall(r"finished, (\d+) cycles", out)]
    if not ends:
        raise RuntimeError(f"no 'finished' line in ASTRA-sim's output: {out.strip().splitlines()[-1:]}")
    return float(max(ends))


def astra_comparison(ranks_list: list[int], timeout_s: float, repeat: int = 3) -> None:
    """ASTRA-sim vs etstore on the same exported transformer workload, both as processes."""
    from etstore.formats.comm_groups import write_astra_et
    from etstore.workloads import transformer

    rt = SHARED / "tests" / "rt_template" / "inputs"
    if not all((ASTRA_BIN / b).exists() for b in ASTRA_BINARY.values()) or not rt.exists():
        emit("astra.skipped", 0, "", 0, reason=f"no ASTRA-sim binaries in {ASTRA_BIN} or no rt_template")
        return
    for n in ranks_list:
        with tempfile.TemporaryDirectory() as tmp:
            d = Path(tmp)
            env = installed_env(d / "pycache")
            paths = write_astra_et(transformer(ranks=n, tp=8, layers=8), d / "w")
            system = json.loads((rt / "system_cfg.json").read_text())
            system["local-mem-bw"] = 1600
            (d / "system.json").write_text(json.dumps(system))
            (d / "network.yml").write_text(
                f"topology: [ Ring ]\nnpus_count: [ {n} ]\nbandwidth: [ 50.0 ]\nlatency: [ 500.0 ]\n"
            )
            files = [str(d / "w"), str(paths[-1]), str(d / "system.json"), str(d / "network.yml")]
            for cong, binary in ASTRA_BINARY.items():
                row: dict[str, object] = {
                    "congestion": cong,
                    "workload": f"transformer tp8 x 8 layers, {n} ranks",
                }
                try:
                    out, a_wall, a_rss = repeated(
                        [
                            str(ASTRA_BIN / binary),
                            f"--workload-configuration={files[0]}",
                            f"--comm-group-configuration={files[1]}",
                            f"--system-configuration={files[2]}",
                            f"--network-configuration={files[3]}",
                            f"--remote-memory-configuration={rt / 'remote_memory_cfg.json'}",
                        ],
                        d,
                        timeout_s,
                        repeat,
                    )
                    a_ns = astra_makespan_ns(out)
                except RuntimeError as exc:
                    emit(f"astra.{n}.{cong}.skipped", 0, "", n, reason=str(exc)[:200])
                    continue
                etstore_run = [sys.executable, "-c", ETSTORE_RUN, *files, cong]
                timed_process(etstore_run, d, timeout_s, env)  # writes the bytecode cache, untimed
                out, e_wall, e_rss = repeated(etstore_run, d, timeout_s, repeat, env)
                e_ns, e_sim = (float(x) for x in out.strip().splitlines()[-1].split())
                fields = dict(zip(("prefix", "groups", "system", "network"), files, strict=True))
                cli = [a.format(store=d / "store", congestion=cong, **fields) for a in ETSTORE_CLI]
                out, c_wall, c_rss = repeated([sys.executable, *cli], d, timeout_s, repeat, env)
                summary = json.loads(out[out.index("{") : out.rindex("}") + 1])
                row.update(
                    astra_total_ns=a_ns,
                    etstore_total_ns=e_ns,
                    astra_wall_s=round(a_wall, 3),
                    etstore_wall_s=round(e_wall, 3),
                    etstore_simulate_s=round(e_sim, 3),
                    etstore_cli_wall_s=round(c_wall, 3),
                    etstore_cli_simulate_s=round(summary["wall_s"], 3),
                    etstore_cli_total_ns=summary["total_ns"],
                    astra_peak_rss_mib=round(a_rss, 1),
                    etstore_peak_rss_mib=round(e_rss, 1),
                    etstore_cli_peak_rss_mib=round(c_rss, 1),
                    wall_ratio=round(e_wall / a_wall, 2),
                    cli_wall_ratio=round(c_wall / a_wall, 2),
                    repeat=repeat,
                )
                emit(f"astra.{n}.{cong}.total_ns_ratio", round(e_ns / a_ns, 6), "etstore/ASTRA-sim", n, **row)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", type=int, default=1_000_000, help="ops of the synthetic workload (default 1M)")
    ap.add_argument("--skip-sweep", action="store_true")
    ap.add_argument("--sizes", default="1M,16M,256M", help="sweep sizes (K/M/G suffixes, powers of 2)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per measurement; the median is reported")
    ap.add_argument(
        "--astra-ranks", default="64,256", help="ranks of the ASTRA-sim comparison (comma list; '' skips it)"
    )
    ap.add_argument("--astra-timeout", type=float, default=600, help="seconds per ASTRA-sim/etstore run")
    ap.add_argument("--astra-only", action="store_true", help="only the ASTRA-sim comparison")
    args = ap.parse_args()

    if args.astra_ranks:
        astra_comparison([int(r) for r in args.astra_ranks.split(",")], args.astra_timeout, args.repeat)
    if args.astra_only:
        return

    rt = SHARED / "tests" / "rt_template" / "inputs"
    if rt.exists():
        from etstore.formats.et import read_et
        from etstore.sim import read_network_config, read_system_config

        cfg = read_system_config(rt / "system_cfg.json")
        res = simulate(
            read_et(rt / "workload" / "chakra_trace"),
            read_network_config(rt / "network_cfg.yml").topology,
            config=cfg,
        )
        emit("sim.rt_template.total_ns", res.total_ns, "ns", 8, reference_ns=117780)

    ring64 = Topology.ring(64)
    exp = expanded_allreduce()
    for cong in ("unaware", "aware"):
        measure("expanded_allreduce_64", exp, ring64, SimConfig(congestion=cong), args.repeat)
    native = collective_workload("allreduce", 64, 64 << 20)
    for cong in ("unaware", "aware"):
        measure("native_allreduce_64", native, ring64, SimConfig(congestion=cong), args.repeat)
    work = synthetic_workload(64, max(1, args.ops // (64 * 4)))
    for cong in ("unaware", "aware"):
        measure("workload_1m", work, ring64, SimConfig(congestion=cong), args.repeat)

    if args.skip_sweep:
        return
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    sizes = [int(s[:-1]) * mult[s[-1]] if s[-1] in mult else int(s) for s in args.sizes.split(",")]
    topos = [
        Topology.mesh([8, 8], latency_ns=500, bandwidth_gb_per_s=50),
        Topology.mesh([4, 4, 4], latency_ns=500, bandwidth_gb_per_s=50),
    ]
    algos: dict[str, object] = {"ring": "ring", "native": "native"}
    try:
        from etstore.algorithms.generators import generate  # noqa: F401

        algos["direct"] = "direct"
    except ImportError:
        pass
    try:
        from etstore.algorithms.synth import synthesize

        def synthesized(topo: Topology, coll: str) -> Trace:
            t0 = time.perf_counter()
            out = synthesize(topo, coll="allreduce").trace
            emit(
                "synth.allreduce.s",
                round(time.perf_counter() - t0, 3),
                "s",
                topo.num_npus,
                topology=topo.name,
            )
            return out

        algos["synthesized"] = synthesized
    except ImportError:
        pass
    for cong in ("unaware", "aware"):
        pts = sweep(sizes, algos, topos, collective="allreduce", config=SimConfig(congestion=cong))  # type: ignore[arg-type]
        for row in pts.to_pylist():
            emit(
                "sweep.allreduce.busbw",
                round(row["busbw_gb_per_s"], 3),
                "GB/s (10^9)",
                row["num_npus"],
                topology=row["topology"],
                algorithm=row["algorithm"],
                congestion=cong,
                size_bytes=row["size_bytes"],
                time_ns=row["time_ns"],
                wall_s=round(row["wall_s"], 3),
            )


if __name__ == "__main__":
    main()
