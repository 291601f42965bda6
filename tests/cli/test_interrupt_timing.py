"""Ctrl-C at any moment of the ``etstore`` command, from its CLI module's first line to the
interpreter's exit: one line, ``etstore: interrupted``, and exit 130, never a traceback
(before the command has its exit code), or nothing at all (after).

Real processes, both ways the command runs (the console script and ``python -m
etstore.cli``), with exact timing: each starts with SIGINT blocked and already sent, and a
``sitecustomize`` audit hook unblocks it during the Nth module import after ``etstore.cli``
began (its own imports, the command module's, the lazy ones of the work), or at the
interpreter's exit. The interpreter's start-up and the ``etstore`` package's own import,
before ``etstore.cli``'s first line runs, are out of any handler's reach (docs/reliability.md).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]

# installed through PYTHONPATH in the command's process; SIGINT is pending there from its start
_SITECUSTOMIZE = """
import _signal, atexit, os, sys

_at = os.environ["ETSTORE_TEST_SIGINT_AT"]  # an import's number, "exit", or "" for never
_seen = []


def _deliver(where):
    with open(os.environ["ETSTORE_TEST_LOG"], "a") as log:
        log.write(f"delivered at {where}\\n")
    _signal.pthread_sigmask(_signal.SIG_UNBLOCK, [_signal.SIGINT])


def _hook(event, args):
    if event == "import" and "etstore.cli" in sys.modules:  # etstore.cli's code has begun
        _seen.append(args[0])
        if str(len(_seen)) == _at:
            _deliver(args[0])


@atexit.register  # registered first, so run last
def _at_exit():
    with open(os.environ["ETSTORE_TEST_LOG"], "a") as log:
        log.write(f"imports {len(_seen)}\\n")
    if _at == "exit":
        _deliver("exit")


sys.addaudithook(_hook)
"""

# what pip writes for the ``etstore`` console script (argv[0] names it)
_CONSOLE_SCRIPT = """import re
import sys
from etstore.cli import main
if __name__ == '__main__':
    sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])
    sys.exit(main())
"""

COMMAND = ["topo", "show", "ring:4", "--format", "json"]  # imports numpy, pyarrow, protobuf, orjson


def _run(entry: list[str], tmp: Path, at: str) -> tuple[int, str, str, list[str]]:
    """Exit code, stdout, stderr and log lines of ``entry COMMAND``, SIGINT delivered at ``at``."""
    log = tmp / f"log-{entry[-1].replace('/', '_')}-{at or 'never'}"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp / "site"), str(ROOT)]),
        "ETSTORE_TEST_SIGINT_AT": at,
        "ETSTORE_TEST_LOG": str(log),
    }
    # blocked in this thread, the mask is the child's from its first instruction; pending until the hook
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        proc = subprocess.Popen(
            [*entry, *COMMAND], cwd=tmp, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    return proc.returncode, out, err, log.read_text().splitlines() if log.exists() else []


@pytest.mark.skipif(not hasattr(signal, "pthread_sigmask"), reason="needs POSIX signal masks")
def test_ctrl_c_at_every_stage_is_one_line_or_nothing(tmp_path: Path) -> None:
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(_SITECUSTOMIZE)
    script = tmp_path / "etstore"
    script.write_text(_CONSOLE_SCRIPT)
    entries = {"console script": [sys.executable, str(script)], "-m": [sys.executable, "-m", "etstore.cli"]}

    with ThreadPoolExecutor(4) as pool:
        plain = dict(zip(entries, pool.map(lambda e: _run(e, tmp_path, ""), entries.values()), strict=True))
        runs = []
        for name, (code, _out, err, log) in plain.items():
            # never delivered: the command's own answer, and the number of imports to aim at
            assert (code, err) == (0, ""), (name, err[-3000:])
            imports = int(log[-1].split()[1])
            assert imports > 100, (name, log)  # the command module and the work import plenty
            # etstore.cli's own imports one by one, then through the command's and the work's
            points = [*range(1, 7), imports // 4, imports // 2, imports * 9 // 10]
            runs += [(name, str(n)) for n in sorted(set(points))] + [(name, "exit")]
        results = pool.map(lambda r: _run(entries[r[0]], tmp_path, r[1]), runs)

        for (name, at), (code, out, err, log) in zip(runs, results, strict=True):
            assert "Traceback" not in err, (name, at, err[-3000:])
            delivered = [line for line in log if line.startswith("delivered at ")]
            assert delivered, (name, at, log)  # the test's own check: the signal did arrive
            if at == "exit":  # the command had its exit code: Ctrl-C changes nothing any more
                assert (code, out, err) == (0, plain[name][1], ""), (name, at, err[-3000:])
            else:
                assert (code, out, err) == (130, "", "etstore: interrupted\n"), (
                    name,
                    at,
                    delivered,
                    err[-3000:],
                )
