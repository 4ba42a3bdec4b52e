"""Profiler-trace analysis: where a step's time goes (quantize / GEMM / other) and why the GPU idles.

Rule: a torch.profiler Chrome trace's complete events are attributed to phases innermost-first (nothing
counted twice, phases sum to the window), by the learner's ``record_function`` annotations or by op and
kernel names; a device gap is host-bound when the launch that ends it began after the gap began. The
definitions live on :func:`load_trace`, :func:`wall_window`, :func:`phase_times`, :func:`gpu_idle` and
:func:`added_time_idle_fraction`; what the numbers are for: docs/metrics.md (Traces).
"""

from __future__ import annotations

import gzip
import heapq
import json
import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

__all__ = [
    "DEFAULT_PHASES",
    "DEVICE_CATEGORIES",
    "NO_DEVICE_MESSAGE",
    "AddedTime",
    "GpuIdle",
    "IdleGap",
    "added_time_idle_fraction",
    "gpu_idle",
    "load_trace",
    "phase_times",
    "wall_window",
]

#: Phase → regular expression (case-insensitive ``re.search``) over op and kernel names, for ``by="names"``.
#: Order matters: the first phase whose pattern matches a name wins.
DEFAULT_PHASES: dict[str, str] = {
    # aten::mm / addmm / bmm / _scaled_mm / matmul, cuBLAS(Lt) and CUTLASS kernels, Hopper/Blackwell xmma, nvjet
    "gemm": r"gemm|matmul|addmm|bmm|(?<![a-z])mm(?![a-z])|cutlass|xmma|cublas|nvjet",
    # TE/torchao/our quantize ops and kernels: quantize_*, cast_to_fp8, *mxfp8*, cast_transpose, to_mx, float8
    "quantize": r"quant|cast_to_fp8|fp8_cast|mxfp8|cast_transpose|to_mx(?![a-z])|float8",
}
#: Categories of device activity (the device is busy while one of these runs).
DEVICE_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
_IGNORED_CATEGORIES = frozenset({"Trace", "gpu_user_annotation"})
_LAUNCH_CATEGORIES = frozenset({"cuda_runtime", "cuda_driver"})
_NOT_OPS = _LAUNCH_CATEGORIES | {"user_annotation"}
NO_DEVICE_MESSAGE = "no device kernels in this trace (a CPU-only profile): GPU idle time is undefined"


@dataclass(frozen=True)
class _Event:
    name: str
    cat: str
    pid: Any
    tid: Any
    start: float
    end: float
    args: Mapping[str, Any]

    @property
    def device(self) -> Any:
        return self.args.get("device", self.pid)


# ------------------------------------------------------------------------------------------ loading


def load_trace(trace: Any) -> list[dict[str, Any]]:
    """The ``traceEvents`` list of a Chrome trace given as a path (``.json`` or ``.json.gz``), the
    parsed dict, or the event list itself.

    ``prof.export_chrome_trace(path)`` (what :func:`fp8rl_core.learner.grpo.grpo_step` writes with
    ``trace_path=``) produces ``{"traceEvents": [...]}`` in the Chrome Trace Event Format
    (https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU). Only *complete*
    events (``"ph": "X"``, start ``ts`` and duration ``dur`` in µs) carry time; Kineto, PyTorch's profiler
    backend, tags each with a category ``cat``:

    * host side — ``cpu_op`` (ATen operators, nested per thread), ``user_annotation`` (a
      ``torch.profiler.record_function`` range), ``python_function``, ``cuda_runtime`` / ``cuda_driver``
      (``cudaLaunchKernel``, ``cuLaunchKernel``, ``cudaMemcpyAsync`` …, with ``args.correlation``);
    * device side — ``kernel``, ``gpu_memcpy``, ``gpu_memset`` on ``pid`` = the device, ``tid`` = the
      stream, with the same ``args.correlation`` as the host call that launched them; ``gpu_user_annotation``
      (a record_function range projected onto a stream — not work, ignored here);
    * ``Trace`` — the profiler's own envelope ("PyTorch Profiler (0)"), ignored.

    Flow events (``"ph": "s"`` at the launch, ``"ph": "f"`` at the kernel, same ``id``, category ``ac2g``)
    draw the launch→kernel arrows; they are used to link a kernel to its launch when ``args.correlation``
    is absent. ``"M"`` metadata and ``"i"`` instant events carry no duration and are skipped.
    """
    if isinstance(trace, (str, Path)):
        path = Path(trace)
        if not path.is_file():
            raise ValueError(f"trace: no such file {str(path)!r}")
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt") as fh:
            try:
                trace = json.load(fh)
            except json.JSONDecodeError as exc:
                raise ValueError(f"trace: {str(path)!r} is not JSON ({exc})") from None
    if isinstance(trace, Mapping):
        if "traceEvents" not in trace:
            raise ValueError(f"trace: a Chrome trace needs a 'traceEvents' list; keys are {sorted(trace)}")
        trace = trace["traceEvents"]
    if not isinstance(trace, list):
        raise ValueError(f"trace: expected a path, a Chrome-trace dict or an event list, got {type(trace).__name__}")
    return trace


@dataclass
class _Trace:
    host: list[_Event]  # complete host events (cpu_op, user_annotation, cuda_runtime, ...)
    device: list[_Event]  # kernels, memcpys, memsets
    flows: dict[Any, dict[str, tuple[Any, Any, float]]]  # (cat, id) -> {"s"/"f": (pid, tid, ts)}


def _parse(trace: Any) -> _Trace:
    host: list[_Event] = []
    device: list[_Event] = []
    flows: dict[Any, dict[str, tuple[Any, Any, float]]] = defaultdict(dict)
    for raw in load_trace(trace):
        if not isinstance(raw, Mapping):
            continue
        ph = raw.get("ph")
        if ph in ("s", "f") and "id" in raw and "ts" in raw:
            # keyed by (category, id): ac2g (launch→kernel) ids are correlation ids and may repeat the
            # ids of other flow kinds (fwdbwd links forward ops to their backward)
            flows[(raw.get("cat"), raw["id"])][ph] = (raw.get("pid"), raw.get("tid"), float(raw["ts"]))
            continue
        if ph != "X" or "ts" not in raw or "dur" not in raw:
            continue
        cat = str(raw.get("cat", ""))
        if cat in _IGNORED_CATEGORIES:
            continue
        start, dur = float(raw["ts"]), float(raw["dur"])
        if dur < 0:
            continue
        args = raw.get("args") or {}
        ev = _Event(str(raw.get("name", "")), cat, raw.get("pid"), raw.get("tid"), start, start + dur, args)
        (device if cat in DEVICE_CATEGORIES else host).append(ev)
    return _Trace(host, device, dict(flows))


def _extent(events: Sequence[_Event]) -> tuple[float, float] | None:
    if not events:
        return None
    return min(e.start for e in events), max(e.end for e in events)


def wall_window(trace: Any) -> tuple[float, float]:
    """(first start, last end) in µs over all host and device events (the ``Trace`` envelope and
    ``gpu_user_annotation`` excluded): the wall the profile measured."""
    return _wall(_parse(trace))


def _wall(t: _Trace) -> tuple[float, float]:
    ext = _extent(t.host + t.device)
    if ext is None:
        raise ValueError("trace: no complete ('ph': 'X') events with ts/dur — nothing was profiled")
    return ext


def _window(window: Any, default: tuple[float, float], t: _Trace) -> tuple[float, float]:
    if window is None:
        return default
    if isinstance(window, str):
        if window != "wall":
            raise ValueError(f"window: expected None, 'wall' or (start_us, end_us), got {window!r}")
        return _wall(t)
    try:
        lo, hi = (float(v) for v in window)
    except (TypeError, ValueError):
        raise ValueError(f"window: expected None, 'wall' or (start_us, end_us), got {window!r}") from None
    if not hi > lo:
        raise ValueError(f"window: end must be after start, got ({lo}, {hi})")
    return lo, hi


# ------------------------------------------------------------------------------------- interval helpers


def _union(intervals: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for s, e in sorted(intervals):
        if e <= s:
            continue
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1] = (out[-1][0], e)
        else:
            out.append((s, e))
    return out


def _innermost_attribution(intervals: Sequence[tuple[float, float, str]], lo: float, hi: float) -> dict[str, float]:
    """Time in [lo, hi] per label, each instant going to the innermost covering interval (see module doc)."""
    items = sorted((max(s, lo), min(e, hi), lab) for s, e, lab in intervals if min(e, hi) > max(s, lo))
    bounds = sorted({b for s, e, _ in items for b in (s, e)})
    totals: dict[str, float] = defaultdict(float)
    heap: list[tuple[float, float, int, str]] = []  # (-start, end, seq, label): top = latest start, then shortest
    i = 0
    for a, b in zip(bounds, bounds[1:]):
        while i < len(items) and items[i][0] <= a:
            s, e, lab = items[i]
            heapq.heappush(heap, (-s, e, i, lab))
            i += 1
        while heap and heap[0][1] <= a:
            heapq.heappop(heap)
        # dead entries may remain below the top, but the top is now live and starts latest of all
        if heap:
            totals[heap[0][3]] += b - a
    return dict(totals)


# ------------------------------------------------------------------------------------ classification


def _compile(phases: Mapping[str, str] | None) -> dict[str, re.Pattern[str]]:
    phases = DEFAULT_PHASES if phases is None else phases
    if not isinstance(phases, Mapping) or not phases:
        raise ValueError(f"phases: expected a non-empty mapping phase -> name regex, got {phases!r}")
    out = {}
    for name, pattern in phases.items():
        if name in ("other", "idle"):
            raise ValueError(f"phases: {name!r} is reserved for the remainder")
        try:
            out[str(name)] = re.compile(pattern, re.IGNORECASE)
        except (re.error, TypeError) as exc:
            raise ValueError(f"phases: bad pattern for {name!r}: {exc}") from None
    return out


def _annotation_phase(name: str, phases: Sequence[str]) -> str | None:
    low = name.lower()
    for p in phases:
        pl = p.lower()
        if low == pl or low.endswith("::" + pl):
            return p
    return None


def _name_phase(name: str, patterns: Mapping[str, re.Pattern[str]]) -> str | None:
    for p, rx in patterns.items():
        if rx.search(name):
            return p
    return None


def _launch_index(t: _Trace) -> tuple[dict[Any, _Event], dict[tuple[Any, Any, float], _Event]]:
    by_corr: dict[Any, _Event] = {}
    by_pos: dict[tuple[Any, Any, float], _Event] = {}
    for e in t.host:
        corr = e.args.get("correlation")
        if corr is not None:
            by_corr.setdefault(corr, e)
        key = (e.pid, e.tid, e.start)
        # a flow starts at its launch call; an op starting at the same instant must not shadow it
        if key not in by_pos or (e.cat in _LAUNCH_CATEGORIES and by_pos[key].cat not in _LAUNCH_CATEGORIES):
            by_pos[key] = e
    return by_corr, by_pos


def _launches(t: _Trace) -> dict[int, _Event]:
    """Device event index → the host call that launched it (via ``args.correlation``, else flow events)."""
    by_corr, by_pos = _launch_index(t)
    flow_by_end: dict[tuple[Any, Any, float], tuple[Any, Any, float]] = {}
    for parts in t.flows.values():
        if "s" in parts and "f" in parts:
            flow_by_end[parts["f"]] = parts["s"]
    out: dict[int, _Event] = {}
    for i, k in enumerate(t.device):
        corr = k.args.get("correlation")
        launch = by_corr.get(corr) if corr is not None else None
        if launch is None:
            src = flow_by_end.get((k.pid, k.tid, k.start))
            if src is not None:
                launch = by_pos.get(src)
        if launch is not None:
            out[i] = launch
    return out


def _enclosing_phase(t: _Trace, queries: Mapping[int, _Event], phases: Sequence[str]) -> dict[int, str]:
    """For each query (a launch event), the innermost phase annotation on its thread that contains its start."""
    anns: dict[tuple[Any, Any], list[tuple[float, float, str]]] = defaultdict(list)
    for e in t.host:
        if e.cat == "user_annotation":
            p = _annotation_phase(e.name, phases)
            if p is not None:
                anns[(e.pid, e.tid)].append((e.start, e.end, p))
    out: dict[int, str] = {}
    for key, lst in anns.items():
        lst.sort(key=lambda a: (a[0], -a[1]))
        qs = sorted((ev.start, i) for i, ev in queries.items() if (ev.pid, ev.tid) == key)
        stack: list[tuple[float, float, str]] = []
        j = 0
        for ts, i in qs:
            while j < len(lst) and lst[j][0] <= ts:
                while stack and stack[-1][1] <= lst[j][0]:
                    stack.pop()
                stack.append(lst[j])
                j += 1
            while stack and stack[-1][1] <= ts:
                stack.pop()
            if stack:
                out[i] = stack[-1][2]
    return out


# ------------------------------------------------------------------------------------------ analyses


def phase_times(trace: Any, phases: Mapping[str, str] | None = None, *, by: str = "auto", where: str = "host",
                window: Any = "wall", device: Any = None) -> dict[str, Any]:
    """Time per phase of a profiled span.

    Each instant of the window is attributed to at most one phase: the *innermost* classified interval
    covering it (latest start; on equal starts the shorter). Nested ops (``aten::linear`` ⊃
    ``aten::addmm``) and overlapping threads are therefore never counted twice, the phases plus
    ``other`` (plus ``idle`` on the device) sum to the window, and each phase is ≤ the wall.
    Classification: ``by="annotations"`` uses ``user_annotation`` ranges named after a phase (``gemm``,
    ``quantize``, or ``<namespace>::gemm``); on the device a kernel belongs to the phase annotation that
    encloses its launch on the launching thread. ``by="names"`` matches op and kernel names against
    regular expressions (:data:`DEFAULT_PHASES`; the first phase that matches wins, GEMMs first so that
    ``cutlass_mxfp8_gemm`` is a GEMM). ``by="auto"`` uses annotations when the trace has any phase
    annotation, else names. The learner's timers (:func:`fp8rl_core.learner.timers.timed`) open a
    ``record_function(kind)`` range while a profiler records, so a trace of an MXFP8 step carries
    ``quantize`` / ``gemm`` annotations and ``auto`` uses them — the only way to find the MXFP8
    emulation's quantization on CPU, whose plain ATen ops (abs, amax, bit operations) no name pattern
    recognises (by name, its time lands in ``other``). A BF16 learner has no MXFP8 layers and so no
    annotations (``auto`` falls back to names there), and the annotations cover only the MXFP8 layers
    while names cover every matmul: compare traces of two precisions with the same explicit ``by``.

    ``phases``: phase → name regex (default :data:`DEFAULT_PHASES`: ``gemm``, ``quantize``); the phase
    names are also the annotation labels looked for. ``by``: "auto" | "annotations" | "names".
    ``where``: "host" — attribute host events (op/annotation intervals) over the window; "device" —
    attribute device activity (kernels by enclosing launch annotation or by kernel name; unclassified
    kernels are ``other``, time with no kernel is ``idle``). ``window``: "wall" (default), None (same),
    or (start_us, end_us). ``device``: which device, for ``where="device"`` on a multi-device trace.

    Returns ``{"by", "where", "window_us": (start, end), "wall_us", "phases_us": {phase…, "other"
    [, "idle"]}, "fractions": same keys / wall, "counts": {phase: classified events overlapping the
    window}}``; the values in ``phases_us`` sum to ``wall_us``.
    """
    patterns = _compile(phases)
    names = list(patterns)
    if by not in ("auto", "annotations", "names"):
        raise ValueError(f"by: expected 'auto', 'annotations' or 'names', got {by!r}")
    if where not in ("host", "device"):
        raise ValueError(f"where: expected 'host' or 'device', got {where!r}")
    t = _parse(trace)
    lo, hi = _window(window, _wall(t), t)
    annotations = [(e, p) for e in t.host if e.cat == "user_annotation"
                   for p in [_annotation_phase(e.name, names)] if p is not None]
    mode = ("annotations" if annotations else "names") if by == "auto" else by

    labelled: list[tuple[float, float, str]] = []
    if where == "host":
        if mode == "annotations":
            labelled = [(e.start, e.end, p) for e, p in annotations]
        else:
            for e in t.host:
                if e.cat in _NOT_OPS:
                    continue  # annotations are labels, not ops; launch calls belong to the op issuing them
                p = _name_phase(e.name, patterns)
                if p is not None:
                    labelled.append((e.start, e.end, p))
    else:
        if not t.device:
            raise ValueError(f"where: 'device' needs device kernels, but {NO_DEVICE_MESSAGE}")
        chosen = _pick_device(t, device)
        phase_of = _enclosing_phase(t, _launches(t), names) if mode == "annotations" else {}
        for i in chosen:
            k = t.device[i]
            p = phase_of.get(i) if mode == "annotations" else _name_phase(k.name, patterns)
            labelled.append((k.start, k.end, p if p is not None else "other"))

    counts = {p: sum(1 for s, e, q in labelled if q == p and e > lo and s < hi) for p in names}
    totals = _innermost_attribution(labelled, lo, hi)
    wall = hi - lo
    out = {p: totals.get(p, 0.0) for p in names}
    if where == "host":
        out["other"] = max(wall - sum(out.values()), 0.0)
    else:
        out["other"] = totals.get("other", 0.0)
        out["idle"] = max(wall - sum(out.values()), 0.0)
    return {
        "by": mode,
        "where": where,
        "window_us": (lo, hi),
        "wall_us": wall,
        "phases_us": out,
        "fractions": {k: (v / wall if wall > 0 else 0.0) for k, v in out.items()},
        "counts": counts,
    }


def _pick_device(t: _Trace, device: Any) -> list[int]:
    devices = sorted({k.device for k in t.device}, key=str)
    if device is None:
        if len(devices) > 1:
            raise ValueError(f"device: the trace has activity on devices {devices}; choose one")
        return list(range(len(t.device)))
    idx = [i for i, k in enumerate(t.device) if k.device == device]
    if not idx:
        raise ValueError(f"device: no activity on device {device!r}; the trace has {devices}")
    return idx


@dataclass(frozen=True)
class IdleGap:
    """A maximal idle interval of the device: ``start_us``/``end_us``/``dur_us``; ``cause`` "host" (the
    device waited for the host to launch more work), "device" (the work was queued but held back) or
    "unknown" (see :func:`gpu_idle`); ``next``: the kernel that ended it (None if none);
    ``launch_us``: the start of that kernel's launch call (None if not linked)."""

    start_us: float
    end_us: float
    dur_us: float
    cause: Literal["host", "device", "unknown"]
    next: str | None
    launch_us: float | None


@dataclass(frozen=True)
class GpuIdle:
    """Device busy/idle time over a window and its idle gaps (:func:`gpu_idle`).

    ``has_device_activity``: False for a trace without device events (a CPU profile): then ``message``
    says so and the times and fractions are None. ``device_events`` counted, ``window_us`` (start, end),
    ``busy_us``, ``idle_us``, ``idle_fraction`` (of the window); ``gaps`` (:class:`IdleGap`, in time
    order), ``n_gaps``, ``host_bound_gaps`` (how many were host-bound), ``host_bound_us``,
    ``host_bound_fraction`` (of idle time), ``host_bound_gap_fraction`` (of gaps), ``device_side_us``,
    ``unknown_us``."""

    has_device_activity: bool
    message: str | None
    device_events: int
    window_us: tuple[float, float] | None
    busy_us: float | None
    idle_us: float | None
    idle_fraction: float | None
    gaps: tuple[IdleGap, ...]
    n_gaps: int
    host_bound_gaps: int
    host_bound_us: float | None
    host_bound_fraction: float | None
    host_bound_gap_fraction: float | None
    device_side_us: float | None
    unknown_us: float | None


def gpu_idle(trace: Any, window: Any = None, *, device: Any = None) -> GpuIdle:
    """Device busy/idle time, the idle gaps, and how many of them were the device waiting for the host.

    ``window``: None (default) — first to last device activity; "wall" — the whole profiled span
    (idle before the first kernel and after the last one counts); or (start_us, end_us). ``device``:
    which device when the trace has several (``args.device``, else the event's ``pid``).

    Returns a :class:`GpuIdle`. A trace without device
    activity (a CPU profile) is not an error: ``has_device_activity`` is False, ``message`` says so and
    the numbers are None.

    Device busy time is the union of all kernel/memcpy/memset intervals of one device over all its
    streams; idle is the window minus busy. A *gap* is a maximal idle interval. A gap is **host-bound**
    when the launch call of the kernel that ends it (its ``cudaLaunchKernel``-like event) *began at or
    after the gap began*: the device ran dry and then waited for the host to issue more work — the
    signature of launch/Python overhead. When the launch was issued before the device went idle the
    gap is **device-side** (the work was queued but held back: a stream/event dependency, a
    synchronisation, launch latency). A gap with no following kernel in the window, or whose kernel has
    no linked launch, is **unknown**.
    """
    return _gpu_idle(_parse(trace), window, device)


def _gpu_idle(t: _Trace, window: Any, device: Any) -> GpuIdle:
    if not t.device:
        return GpuIdle(
            has_device_activity=False, message=NO_DEVICE_MESSAGE, device_events=0, window_us=None, busy_us=None,
            idle_us=None, idle_fraction=None, gaps=(), n_gaps=0, host_bound_gaps=0, host_bound_us=None,
            host_bound_fraction=None, host_bound_gap_fraction=None, device_side_us=None, unknown_us=None,
        )
    chosen = _pick_device(t, device)
    events = [t.device[i] for i in chosen]
    lo, hi = _window(window, _extent(events), t)
    busy = _union([(max(k.start, lo), min(k.end, hi)) for k in events])
    busy_us = sum(e - s for s, e in busy)
    launches = _launches(t)
    # the device event that ends each gap: the earliest-launched among those starting exactly there
    starting: dict[float, list[int]] = defaultdict(list)
    for i in chosen:
        starting[t.device[i].start].append(i)

    gaps: list[IdleGap] = []
    cursor = lo
    for s, e in busy + [(hi, hi)]:
        if s > cursor:
            cause, nxt, launch_us = "unknown", None, None
            cands = starting.get(s, []) if s < hi else []
            if cands:
                linked = [i for i in cands if i in launches]
                k = min(linked, key=lambda i: launches[i].start) if linked else cands[0]
                nxt = t.device[k].name
                if k in launches:
                    launch_us = launches[k].start
                    cause = "host" if launch_us >= cursor else "device"
            gaps.append(IdleGap(cursor, s, s - cursor, cause, nxt, launch_us))
        cursor = max(cursor, e)

    idle_us = (hi - lo) - busy_us
    host_us = sum((g.dur_us for g in gaps if g.cause == "host"), 0.0)
    n_host = sum(g.cause == "host" for g in gaps)
    return GpuIdle(
        has_device_activity=True,
        message=None,
        device_events=len(events),
        window_us=(lo, hi),
        busy_us=busy_us,
        idle_us=idle_us,
        idle_fraction=idle_us / (hi - lo),
        gaps=tuple(gaps),
        n_gaps=len(gaps),
        host_bound_gaps=n_host,
        host_bound_us=host_us,
        host_bound_fraction=host_us / idle_us if idle_us > 0 else None,
        host_bound_gap_fraction=n_host / len(gaps) if gaps else None,
        device_side_us=sum((g.dur_us for g in gaps if g.cause == "device"), 0.0),
        unknown_us=sum((g.dur_us for g in gaps if g.cause == "unknown"), 0.0),
    )


@dataclass(frozen=True)
class AddedTime:
    """Of the extra wall time the MXFP8 trace takes over the BF16 one, the share the device sat idle
    (:func:`added_time_idle_fraction`).

    ``wall_us``, ``idle_us``, ``host_bound_us``: per trace, ``{"mxfp8": …, "bf16": …}`` (idle None for a
    trace without device activity); ``added_wall_us``, ``added_idle_us``, ``added_host_bound_us``: MXFP8
    minus BF16; ``idle_fraction_of_added``, ``host_bound_fraction_of_added``: the added idle (host-bound
    idle) over the added wall. The added idle and fractions are None, and ``message`` says why, when a
    trace has no device activity or MXFP8 added no wall time."""

    wall_us: dict[str, float]
    idle_us: dict[str, float | None]
    host_bound_us: dict[str, float | None]
    added_wall_us: float
    added_idle_us: float | None
    added_host_bound_us: float | None
    idle_fraction_of_added: float | None
    host_bound_fraction_of_added: float | None
    message: str | None


def added_time_idle_fraction(trace_mxfp8: Any, trace_bf16: Any, *, device: Any = None) -> AddedTime:
    """Of the extra wall time the MXFP8 trace takes over the BF16 one, the share the device sat idle.

    Each trace is measured over its own wall (:func:`wall_window`), with :func:`gpu_idle`. Returns an
    :class:`AddedTime`; its fractions are None (with a message) when MXFP8 added no wall time or a trace
    has no device activity.

    ``(idle_mxfp8 − idle_bf16) / (wall_mxfp8 − wall_bf16)``, idle measured over each trace's wall: of
    the extra wall time MXFP8 costs, the share during which the device did nothing; the same with
    host-bound idle says how much of the added time is the GPU waiting for the host (docs/design.md,
    "Reference results": "a trace shows the GPU waiting for the host for most of the added time").
    Both traces must profile the same work (same micro-batch plan). The ratio is not clipped: above 1
    means device busy time shrank (faster FP8 kernels) while idle grew by more than the wall did.
    """
    wall: dict[str, float] = {}
    idle: dict[str, float | None] = {}
    host: dict[str, float | None] = {}
    missing = []
    for name, tr in (("mxfp8", trace_mxfp8), ("bf16", trace_bf16)):
        t = _parse(tr)
        lo, hi = _wall(t)
        wall[name] = hi - lo
        if t.device:
            g = _gpu_idle(t, (lo, hi), device)
            idle[name], host[name] = g.idle_us, g.host_bound_us
        else:
            missing.append(name)
            idle[name] = host[name] = None
    added = wall["mxfp8"] - wall["bf16"]

    def result(message: str | None, added_idle: float | None = None, added_host: float | None = None,
               fractions: bool = False) -> AddedTime:
        return AddedTime(wall, idle, host, added, added_idle, added_host,
                         added_idle / added if fractions else None, added_host / added if fractions else None, message)

    if missing:
        return result(f"{' and '.join(missing)} trace: {NO_DEVICE_MESSAGE}")
    added_idle, added_host = idle["mxfp8"] - idle["bf16"], host["mxfp8"] - host["bf16"]
    if added <= 0:
        return result(f"MXFP8 added no wall time ({added:.6g} µs): there is no added time to attribute", added_idle,
                      added_host)
    return result(None, added_idle, added_host, fractions=True)
