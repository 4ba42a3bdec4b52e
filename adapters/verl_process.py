"""verl's trainer as a supervised subprocess: ``python -m verl.trainer.main_ppo`` started and waited for, killed
with the process that started it, stopped on an interrupted sweep — and what its output says when it failed.

Why a subprocess of the process running the sweep (not a Ray task or a Ray job): tasks/verl_run.py's docstring.
:func:`main_ppo` runs one trainer to its end (its output in a log file; the Ray address its workers write told
once); :func:`stop_all` terminates every trainer this process started that still runs (runs side by side in
threads: :mod:`adapters.sweeps`); :func:`failure_reason` makes verl's output one plain line (:func:`plain_lines`);
:func:`port_race` names a start lost to another process taking its port (worth one more start).
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

from adapters import tracking
from fp8rl_core.verl.payload import RAY_ADDRESS_FILE

__all__ = ["failure_reason", "main_ppo", "plain_lines", "port_race", "stop_all"]

#: lines of verl's output that name an error (a Python exception line, Ray's and Hydra's error lines)
_ERROR = re.compile(r"(\b\w*(Error|Exception)\b|error:)")
#: a Python exception line — ``fp8rl_core.verl.checking.CheckFailedError: …``, Ray's wrapper of one
#: ``ray.exceptions.RayTaskError(CheckFailedError): …`` (group 2: the wrapped exception's name)
_EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt)\w*(\([\w.]+\))?: ")
#: the prefix of a line a Ray worker's output was forwarded with: ``(WorkerDict pid=29515)``, ``(pid=29515, ip=…)``
_RAY_PREFIX = re.compile(r"^\((?:\w+ )?pid=\d+[^)]*\)\s?")
#: lines of a traceback: its head, frames, the source lines they quote, their ``^^^`` markers; Hydra's hint
_TRACEBACK = re.compile(r"^(Traceback \(most recent call last\):|\s|[\^~\s]+$|Set the environment variable HYDRA_FULL_ERROR)")
#: Hydra's first line on a failure repeats every override (thousands of characters): they are main_ppo.args
_HYDRA_ECHO = "Error executing job with overrides:"
#: characters kept of one line in the reason
_LINE = 400
#: torch c10d's lines when the port a process group's TCPStore was given is taken by the time it binds or
#: connects (verl picks MASTER_PORT as a free port, closes it, and the ranks bind it later; another process on
#: the host can take it in between): the run never reached its first sync
_PORT_RACE = re.compile(r"TCP client failed to connect/validate to host|Ping failed, invalid value returned from server"
                        r"|EADDRINUSE|[Aa]ddress already in use")


def plain_lines(output: str) -> list[str]:
    """verl's output as plain text, less what only a traceback holds: ANSI escapes and Ray's worker prefixes
    removed; traceback heads, frames, the source lines they quote (``raise …``) and their markers, Hydra's echo
    of the overrides and its hint left out; blank lines dropped."""
    out = []
    for raw in output.splitlines():
        line = _RAY_PREFIX.sub("", tracking.plain_text(raw))
        if line.strip() and not _TRACEBACK.match(line) and not line.startswith(_HYDRA_ECHO):
            out.append(line.strip())
    return out


def failure_reason(returncode: int, output: str, lines: int = 3) -> str | None:
    """None for exit status 0; else ``verl's main_ppo exited with status N (signal S): <cause>`` in one line of
    plain text (:func:`plain_lines`): the cause is the last exception line of the output (the exception Ray's
    ``RayTaskError(…)`` lines wrap — a failed check's line names its condition, rank and layer), else the last
    ``lines`` lines that name an error, else the last ``lines`` lines; each cut at 400 characters."""
    if returncode == 0:
        return None
    status = f"status {returncode}"
    if returncode < 0:
        status += f" (signal {signal.Signals(-returncode).name})"
    text = plain_lines(output)
    exceptions = [x for x in text if _EXCEPTION.match(x)]
    causes = [x for x in exceptions if not _EXCEPTION.match(x).group(1)] or exceptions
    picked = causes[-1:] or [x for x in text if _ERROR.search(x)][-lines:] or text[-lines:]
    tail = " | ".join(x if len(x) <= _LINE else x[:_LINE] + "…" for x in picked) or "no output"
    return f"verl's main_ppo exited with {status}: {tail}"


def port_race(returncode: int, output: str, reports: list[dict]) -> str | None:
    """The line of verl's output that shows the run lost a port race before its first weight sync (a failed
    exit, no check report, a c10d "address taken" line), else None: such a run is worth one more start."""
    if returncode == 0 or reports:
        return None
    hit = next((x.strip() for x in output.splitlines() if _PORT_RACE.search(x)), None)
    return hit[:_LINE] if hit else None



#: verl trainers this process started and that still run (runs side by side in threads: :func:`stop_all`)
_LIVE: set[subprocess.Popen] = set()


def stop_all() -> None:
    """Terminate every verl trainer this process started that still runs (an interrupted sweep whose runs run in
    threads: each run's thread then sees its trainer end and returns)."""
    for proc in list(_LIVE):
        if proc.poll() is None:
            proc.terminate()


def _die_with_parent() -> None:
    """In verl's trainer process before it runs (Linux): SIGKILL when the process that started it dies, so a
    killed run's launcher leaves no trainer behind (the trainer's own Ray shares its fate: Ray's head
    processes die with the driver that started them)."""
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the finally below is what stops it
        pass


def main_ppo(argv: list[str], env: dict[str, str], work: Path, log: Path, on_ray=None) -> int:
    """Run verl's trainer to its end, its output in ``log``; its exit status. ``on_ray(address)``: called once
    when the trainer's Ray workers have written the cluster's address (:data:`RAY_ADDRESS_FILE`)."""
    address = work / RAY_ADDRESS_FILE
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=work,
                                preexec_fn=_die_with_parent if sys.platform == "linux" else None)
        _LIVE.add(proc)
        try:
            while on_ray is not None:
                try:
                    return proc.wait(timeout=2)
                except subprocess.TimeoutExpired:
                    if address.exists():
                        on_ray(address.read_text().strip())
                        on_ray = None
            return proc.wait()
        finally:  # interrupted (a signal, KeyboardInterrupt): verl must not outlive the sweep
            _LIVE.discard(proc)
            if on_ray is not None and address.exists():
                on_ray(address.read_text().strip())
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
