"""The GPU set installed for real on a CPU host: every wheel of ``constraints-gpu.txt`` and the source builds
that need nothing of the host (antlr4; not the two that need nvcc, tools/gpu_host.py) into a scratch environment, then an import of every module a GPU run starts
that can import without a GPU, each that cannot named with why (docs/gpu.md, The GPU set installed on CPU).

The modules: tools/gpu_closure.json's (recorded from a verl run's processes, tools/import_closure.py; not the
distributions it calls optional), the ones
``make setup-gpu``'s last step imports (tools/gpu_lock.py ``START_IMPORTS``: TE, Megatron-Core/-Bridge too)
and every fp8rl module (``fp8rl_core`` but its SGLang sampler: SGLang is not in the set), from the checkout
(``PYTHONPATH``). All in one interpreter, one after another, each result written as it comes; a crash is that
module's result and the rest go on in a fresh interpreter. Why a module does not import: :data:`REASONS`, the
first pattern its error matches. The scratch folder (venv and uv's cache, so nothing stays behind) is deleted
at the end. Several GB of downloads: not in CI — ``make check-gpu-set``, run by the nightly ``upstream-drift``
flow (tasks/upstream.py records the JSON this writes).

    python tools/gpu_set_check.py --python python3.12 --out gpu-set.json [--scratch /tmp]
"""

from __future__ import annotations

import argparse
import json
import os
import pkgutil
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT))

import gpu_lock  # noqa: E402
import import_closure  # noqa: E402
from gpu_host import SOURCE_BUILDS  # noqa: E402

#: why a module does not import here, by the first pattern its ``Type: message`` matches ({0}: the pattern's group)
REASONS = (
    (r"libcuda\.so|libnvidia-ml|NVIDIA driver|no CUDA GPUs|CUDA driver|cudaGetDeviceCount|NVML|nvmlInit",
     "needs the NVIDIA driver or a GPU (none on this host)"),
    (r"No module named '(" + "|".join(b.module for b in SOURCE_BUILDS if b.needs) + r")\b",
     "needs {0}, a source build this check does not install (nvcc)"),
    (r"No module named '([^']+)'", "needs {0}, which the GPU set does not hold"),
    (r"(lib[\w.+-]+\.so[\w.]*): cannot open shared object file", "needs the library {0}, not on this host"),
    (r"([\w.+-]+\.so[\w.]*): undefined symbol: (\w+), version (\S+)",
     "{0} needs {1} from {2}, which the set's library lacks"),
)
#: fp8rl's modules not in a GPU run from this set: SGLang's sampler (SGLang is not in the set)
NOT_GPU_SET = ("fp8rl_core.sampler.sglang",)

#: the importer: results as JSON lines on its own copy of stdout (what a module prints goes to stderr), a module
#: that takes over IMPORT_TIMEOUT_S seconds stopped by an alarm, the interpreter left at once at the end (a thread
#: a module started cannot hold it)
IMPORT_TIMEOUT_S = 300
_RUNNER = r"""
import importlib, json, os, signal, sys, time
out = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)
def too_long(signum, frame):
    raise TimeoutError(f"import took over {int(sys.argv[1])} s")
signal.signal(signal.SIGALRM, too_long)
for module in sys.argv[2:]:
    print(json.dumps({"module": module, "start": True}), file=out, flush=True)
    t = time.perf_counter()
    signal.alarm(int(sys.argv[1]))
    try:
        importlib.import_module(module)
        row = {"module": module, "ok": True}
    except BaseException as e:
        row = {"module": module, "ok": False, "error": f"{type(e).__name__}: {e}".splitlines()[0][:400]}
    signal.alarm(0)
    row["seconds"] = round(time.perf_counter() - t, 2)
    print(json.dumps(row), file=out, flush=True)
out.flush()
os._exit(0)
"""


def reason(error: str) -> str:
    for pattern, why in REASONS:
        m = re.search(pattern, error)
        if m:
            return why.format(*m.groups())
    return "other: " + error


def fp8rl_modules() -> list[str]:
    import fp8rl_core

    names = [m.name for m in pkgutil.walk_packages(fp8rl_core.__path__, "fp8rl_core.")]
    return sorted(n for n in ["fp8rl_core", *names] if not n.startswith(NOT_GPU_SET))


def modules() -> list[str]:
    """The modules imported: the recorded closure's (but the ones tools/import_closure.py ``NOT_PINNED`` calls
    optional: the set does not hold them by design), ``START_IMPORTS``, fp8rl's."""
    optional = {d for d, (kind, _) in import_closure.NOT_PINNED.items() if kind == "optional"}
    top = set(import_closure.top_level_modules())
    recorded = sorted({i.module for i in import_closure.load() if i.distribution not in optional and i.module in top})
    return list(dict.fromkeys([*recorded, *gpu_lock.START_IMPORTS, *fp8rl_modules()]))


def import_all(python: str, names: list[str], env: dict[str, str], timeout: float = 600) -> list[dict]:
    """Import ``names`` one after another in ``python``; a crash or hang is its module's result, then on."""
    results: list[dict] = []
    left = list(names)
    while left:
        proc = subprocess.Popen([python, "-c", _RUNNER, str(IMPORT_TIMEOUT_S), *left], stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True, env=env, cwd=ROOT)
        current = None
        try:
            for line in proc.stdout:
                row = json.loads(line)
                if row.get("start"):
                    current = row["module"]
                    continue
                current = None
                row["why"] = "" if row["ok"] else reason(row["error"])
                results.append(row)
                print(f"  {row['module']}: {'ok' if row['ok'] else row['why']}", flush=True)
            status = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            status = proc.wait()
        done = {r["module"] for r in results}
        if current is not None:
            error = f"the interpreter ended with status {status} while importing it"
            results.append({"module": current, "ok": False, "error": error, "why": "other: " + error, "seconds": 0})
            done.add(current)
        left = [n for n in left if n not in done]
        if current is None:
            break
    return results


def du(path: Path) -> int:
    out = subprocess.run(["du", "-sb", str(path)], capture_output=True, text=True)
    return int(out.stdout.split()[0]) if out.returncode == 0 and out.stdout else 0


def run(python: str, scratch: Path) -> dict:
    folder = Path(tempfile.mkdtemp(prefix="fp8rl-gpu-set-", dir=scratch))
    venv, cache = folder / "venv", folder / "uv-cache"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UV_", "PYTHON", "VIRTUAL_ENV"))}
    env["UV_CACHE_DIR"] = str(cache)
    started = time.time()
    try:
        subprocess.run([gpu_lock.uv(), "venv", "--quiet", "--python", python, str(venv)], env=env, check=True)
        gpu_lock.split(folder)
        wheels = gpu_lock.install_argv(gpu_lock.uv(), ["--python", str(venv / "bin" / "python")], folder)[0]
        print("+", " ".join(wheels), flush=True)
        t = time.time()
        subprocess.run(wheels, env=env, check=True)
        # the source builds that need nothing of the host (antlr4: pure Python, the set's setuptools), with
        # make setup-gpu's own flags for them; the ones needing nvcc are left out
        plain = [b.name for b in SOURCE_BUILDS if not b.needs]
        pins = gpu_lock.lock_pins()
        (folder / "built.txt").write_text("".join(f"{n}=={pins[n]}\n" for n in plain))
        built_cmd = gpu_lock.install_argv(gpu_lock.uv(), ["--python", str(venv / "bin" / "python")], folder)[1]
        print("+", " ".join(built_cmd), flush=True)
        subprocess.run(built_cmd, env=env, check=True)
        install_s = time.time() - t
        sizes = {"venv_bytes": du(venv), "cache_bytes": du(cache), "disk_bytes": du(folder)}
        built = {b.name for b in SOURCE_BUILDS if b.needs}
        set_problems = [p for p in gpu_lock.installed_problems(str(venv / "bin" / "python"))
                        if p.split(":")[0].split("==")[0] not in built]
        version = subprocess.run([str(venv / "bin" / "python"), "-c", "import platform; print(platform.python_version())"],
                                 capture_output=True, text=True, check=True).stdout.strip()
        imports_env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
        imports_env |= {"PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": ""}
        t = time.time()
        rows = import_all(str(venv / "bin" / "python"), modules(), imports_env)
        return {"python": version, "pins": len(gpu_lock.lock_pins()), "source_builds": [b.name for b in SOURCE_BUILDS],
                "install_s": round(install_s, 1), "imports_s": round(time.time() - t, 1),
                "wall_s": round(time.time() - started, 1), **sizes, "set_problems": set_problems, "imports": rows}
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default="python3.12", help="the CPython 3.12 the scratch venv is made with")
    parser.add_argument("--out", required=True, help="where the result (JSON) is written")
    parser.add_argument("--scratch", default=tempfile.gettempdir(), help="the folder the scratch venv goes in")
    args = parser.parse_args()
    result = run(args.python, Path(args.scratch))
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    failed = [r for r in result["imports"] if not r["ok"]]
    print(f"GPU set: {result['pins']} pins ({len(result['set_problems'])} differ), installed in {result['install_s']} s, "
          f"{result['disk_bytes'] / 1e9:.1f} GB; {len(result['imports']) - len(failed)} of {len(result['imports'])} "
          f"modules import, {len(failed)} do not ({args.out})")


if __name__ == "__main__":
    main()
