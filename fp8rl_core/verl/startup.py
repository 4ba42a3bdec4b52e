"""Where a verl run's wall time goes: milestones taken as the run happens, and the table of phases they make
(docs/gpu.md, "Where a verl run's wall time goes").

fp8rl's own pieces append one JSON line ``{"milestone": …, "t": <time.time()>, …}`` to the run's
``startup.jsonl`` (beside ``costs.jsonl``; one short ``O_APPEND`` write, so every process of the run shares
the file) when each milestone happens: the launcher (:mod:`tasks.verl_run`) at the run's start, after each
part of its preparation (``dataset``, ``model``: the warm start and its copy as verl's model folder,
``payload``, ``config``: verl's overrides composed and logged), at ``launch`` (each start of verl's
``main_ppo``) and at ``run_end``; :func:`fp8rl_core.verl.extension.register` in every process of the run
that imports fp8rl's extension (``register``: its seconds, its role — the process title Ray or vLLM gave it —,
the process's own start and, in a Ray worker, its raylet's start: Ray up); the vLLM server actor
(``server`` when constructed, ``server_up`` when verl's ``launch_server`` returned) and the rollout adapter
(``sync_start``/``sync_done`` of each weight sync, by version) in :mod:`fp8rl_core.verl.rollout`; the token
capture (``capture`` of each step) in :mod:`fp8rl_core.verl.capture`.

:func:`wall_split` turns the lines (and the run's ``costs.jsonl``) into :class:`WallSplit`: the phases of
:data:`PHASES`, each ending at a milestone, consecutive, summing to the run's wall (``run_start`` →
``run_end``); a phase whose milestone was not seen is 0 s. A milestone earlier than the one before it (a Ray
cluster the run joined, up before the run) ends its phase where the previous one ended.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from .costs import append_json_line, read_json_lines

__all__ = ["MILESTONES", "PHASES", "PREPARATION", "STARTUP_FILE", "Phase", "WallSplit", "mark", "process_fields",
           "read_milestones", "wall_split"]

STARTUP_FILE = "startup.jsonl"
#: every milestone, in the order a run reaches them
MILESTONES = ("run_start", "dataset", "model", "payload", "config", "launch", "register", "server", "server_up",
              "sync_start", "sync_done", "capture", "run_end")
#: fp8rl's preparation in the launcher, part by part: (part, the milestone that ends it)
PREPARATION = (("dataset", "dataset"), ("warm_start_copy", "model"), ("payload", "payload"), ("config", "config"))
#: the phases of a run's wall, in order: (name, what it holds, the milestone ending it — see :func:`_ends`)
PHASES = (
    ("preparation", "fp8rl's preparation: dataset, warm start and its copy, payload, verl's config", "config"),
    ("verl_driver", "verl's main_ppo: Python, verl's imports, Hydra, ray.init to the raylet's start", "ray_up"),
    ("taskrunner", "Ray's processes, the TaskRunner's process to its first fp8rl code", "taskrunner"),
    ("workers", "verl's trainer set-up: TransferQueue, the actor/ref workers and their models, reward workers",
     "server"),
    ("vllm_server", "the vLLM server actor: its engine's start (verl's launch_server)", "server_up"),
    ("first_sync", "the checkpoint engine, the first weight sync with fp8rl's checks", "first_sync_done"),
    ("agent_loop", "the agent loop's workers, started at the first step: their processes to their first fp8rl code",
     "agent_loop"),
    ("steps", "the RL steps to the last one's weight sync (the first step's generation onwards)", "last_sync_done"),
    ("end", "after the last step's sync: its metrics, verl's and Ray's shutdown", "run_end"),
)


def mark(path: str | Path, milestone: str, t: float | None = None, **fields) -> None:
    """Append ``{"milestone": milestone, "t": t (now), **fields}`` to ``path`` (milestones outside
    :data:`MILESTONES` refused)."""
    if milestone not in MILESTONES:
        raise ValueError(f"unknown milestone {milestone!r}; valid: {list(MILESTONES)}")
    append_json_line(path, {"milestone": milestone, "t": time.time() if t is None else float(t)} | fields)


def read_milestones(path: str | Path) -> list[dict]:
    """The lines of ``path`` in order ([] when it does not exist)."""
    return read_json_lines(path)


def process_fields() -> dict:
    """This process: ``pid``, ``role`` (its title as Ray (``ray::TaskRunnerV1.run`` → ``TaskRunnerV1``,
    ``ray::vllm_server_0_0:Fp8rlHttpServer`` → ``Fp8rlHttpServer``) or vLLM set it, else the module or program it runs), ``process_start`` and, where its parent is Ray's raylet (a
    Ray worker), ``raylet_start`` (psutil's creation times, seconds since the epoch)."""
    import psutil

    me = psutil.Process()
    out = {"pid": me.pid, "role": _role(me.cmdline()), "process_start": me.create_time()}
    try:
        parent = me.parent()
        if parent is not None and parent.name() == "raylet":
            out["raylet_start"] = parent.create_time()
    except psutil.Error:
        pass
    return out


def _role(cmdline: list[str]) -> str:
    if not cmdline:
        return "unknown"
    title = cmdline[0]
    if "::" in title:  # Ray's "ray::Class.method", vLLM's "VLLM::EngineCore"
        head, _, rest = title.partition("::")  # a named actor's: "ray::vllm_server_0_0:Fp8rlHttpServer"
        return rest.split(".")[0].rpartition(":")[2].strip() or head
    if "-m" in cmdline[:-1]:
        return cmdline[cmdline.index("-m") + 1]
    return Path(title).name


@dataclass(frozen=True)
class Phase:
    """One phase of a run's wall: its name, what it holds, its seconds and its share of the wall."""

    name: str
    holds: str
    seconds: float
    share: float


@dataclass(frozen=True)
class WallSplit:
    """A verl run's wall (``run_start`` → ``run_end``) as consecutive :data:`PHASES`; ``steps``: the RL steps
    its syncs show; ``warm_step_s``: the mean step after the first (the first where only one); ``fp8rl``:
    fp8rl's own seconds inside the start-up (``preparation/<part>_s`` of :data:`PREPARATION`, ``register_s``
    summed over the ``processes`` that registered, ``first_sync_s``: export, the masters' copy and the checks
    of sync 0 from ``costs.jsonl``)."""

    wall_s: float
    phases: tuple[Phase, ...]
    steps: int
    warm_step_s: float
    processes: tuple[str, ...]
    fp8rl: Mapping[str, float]

    @property
    def startup_s(self) -> float:
        """The wall less the steps: start-up and end."""
        return self.wall_s - self.phase("steps").seconds

    def phase(self, name: str) -> Phase:
        return next(p for p in self.phases if p.name == name)

    def projected(self, steps: int) -> float:
        """A run of ``steps`` RL steps: this run's wall plus its missing steps as warm steps."""
        return self.wall_s + (steps - self.steps) * self.warm_step_s

    def metrics(self, projected_steps: int = 200) -> dict[str, float]:
        """``time/startup/<phase>_s`` of every phase, ``…/wall_s``, ``…/steps``, ``…/warm_step_s``,
        ``…/projected_<n>_steps_s`` and ``…/fp8rl/<part>`` (MLflow metric names)."""
        out = {f"time/startup/{p.name}_s": p.seconds for p in self.phases}
        out |= {"time/startup/wall_s": self.wall_s, "time/startup/steps": float(self.steps),
                "time/startup/warm_step_s": self.warm_step_s, "time/startup/processes": float(len(self.processes)),
                f"time/startup/projected_{projected_steps}_steps_s": self.projected(projected_steps)}
        out |= {f"time/startup/fp8rl/{k}": v for k, v in self.fp8rl.items()}
        return out


def _ends(lines: list[dict]) -> dict[str, float]:
    """The milestone times that end the phases (the names :data:`PHASES` uses), from one attempt's lines."""
    first: dict[str, float] = {}
    for ln in lines:
        first.setdefault(ln["milestone"], float(ln["t"]))
    regs = [ln for ln in lines if ln["milestone"] == "register"]
    ups = [float(ln["t"]) for ln in lines if ln["milestone"] == "server_up"]
    syncs = {int(ln["version"]): float(ln["t"]) for ln in lines if ln["milestone"] == "sync_done"}
    raylets = [float(ln["raylet_start"]) for ln in regs if "raylet_start" in ln]
    runners = [float(ln["t"]) for ln in regs if str(ln.get("role", "")).startswith("TaskRunner")]  # TaskRunnerV1 too
    loops = [float(ln["t"]) for ln in regs if str(ln.get("role", "")).startswith("AgentLoopWorker")]  # …TQ too
    out = {k: first[k] for k in ("config", "server", "run_end") if k in first}
    if raylets:
        out["ray_up"] = min(raylets)
    if runners:
        out["taskrunner"] = min(runners)
    if ups:
        out["server_up"] = max(ups)
    if loops:
        out["agent_loop"] = min(loops)
    if 0 in syncs:
        out["first_sync_done"] = syncs[0]
    if syncs:
        out["last_sync_done"] = syncs[max(syncs)]
    return out


def wall_split(lines: Iterable[Mapping], costs: Iterable[Mapping] = ()) -> WallSplit:
    """The :class:`WallSplit` of a run's milestone ``lines`` (:func:`read_milestones`) and its ``costs.jsonl``
    lines. A run started more than once (a lost port race) is split by its last ``launch``: the lines of
    verl's processes before it belong to the attempt that failed, whose time falls in ``verl_driver``."""
    lines = sorted((dict(x) for x in lines), key=lambda x: float(x["t"]))
    names = {ln["milestone"] for ln in lines}
    if not {"run_start", "run_end"} <= names:
        raise ValueError(f"a run's wall needs its run_start and run_end milestones; got {sorted(names)}")
    launches = [float(ln["t"]) for ln in lines if ln["milestone"] == "launch"]
    cut = max(launches) if launches else -float("inf")
    attempt = [ln for ln in lines if float(ln["t"]) >= cut or ln["milestone"] in ("run_start", *dict(PREPARATION).values())]
    ends = _ends(attempt)
    t0 = min(float(ln["t"]) for ln in lines if ln["milestone"] == "run_start")
    t1 = ends["run_end"]
    wall = t1 - t0
    phases, prev = [], t0
    for name, holds, end in PHASES:
        t = min(max(prev, ends.get(end, prev)), t1)
        phases.append(Phase(name, holds, t - prev, (t - prev) / wall if wall > 0 else 0.0))
        prev = t
    syncs = sorted({int(ln["version"]): float(ln["t"]) for ln in attempt if ln["milestone"] == "sync_done"}.items())
    step_s = [b - a for (_, a), (_, b) in zip(syncs, syncs[1:])]
    warm = step_s[1:] or step_s
    fp8rl: dict[str, float] = {}
    prev_t = t0
    for part, milestone in PREPARATION:
        t = next((float(ln["t"]) for ln in lines if ln["milestone"] == milestone), None)
        if t is not None:
            fp8rl[f"preparation/{part}_s"] = t - prev_t
            prev_t = t
    regs = [ln for ln in attempt if ln["milestone"] == "register"]
    fp8rl["register_s"] = sum(float(ln.get("seconds", 0.0)) for ln in regs)
    sync0 = [c for c in costs if int(c["step"]) == 0]
    if sync0:
        fp8rl["first_sync_s"] = sum(float(c.get(k, 0.0)) for c in sync0 for k in ("export_s", "keep_s", "checks_s"))
    return WallSplit(wall, tuple(phases), len(step_s), sum(warm) / len(warm) if warm else 0.0,
                     tuple(str(ln.get("role", "unknown")) for ln in regs), fp8rl)
