"""The SGLang engine behind the sampler seam: SGLang's HTTP server in its own venv, driven over HTTP.

Rule: :class:`SglangSampler` starts ``python -m fp8rl_core.sampler.sglang.compat`` (SGLang's ``launch_server``
with fp8rl's workarounds, :mod:`.compat`) with the SGLang venv's interpreter, and talks to it over HTTP only
(no SGLang import in this process). Weights cross as files (:mod:`fp8rl_core.sync.transport`), loaded in place
on every rank by fp8rl's SGLang loader; per-rank operations (:mod:`.worker`) answer through files. Every call
watches the server process: its death raises :class:`~fp8rl_core.sampler.seam.SamplerDeadError` with its last
log lines, and no call waits past its deadline. Described in docs/design.md (Engines) and docs/gpu.md
(Tensor-parallel ranks and SGLang).
"""

from __future__ import annotations

import concurrent.futures
import json
import math
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import weakref
from collections import deque
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch
from safetensors.torch import load_file

from fp8rl_core.sampler.capabilities import capabilities, refusal
from fp8rl_core.sampler.config import MX_GRID, SamplerConfig, engine_key
from fp8rl_core.sampler.sglang.compat import RPC, rpc_payload
from fp8rl_core.sampler.seam import (Rollout, Sampler, SamplerDeadError, SamplerError, SyncTiming, engine_config,
                                     file_sync, prompt_rows, stop_ids)
from fp8rl_core.sync.hooks import NO_HOOKS, SyncHooks
from fp8rl_core.sync.layout import ModelLayout
from fp8rl_core.sync.ranks import RankCheck, slice_for_rank
from fp8rl_core.sync.transport import default_root, write_sync

__all__ = ["PYTHON_ENV", "SglangSampler", "mxfp8_refusal"]

#: the environment variable naming the SGLang venv's interpreter (``make setup-sglang``: .venv-sglang/bin/python): the
#: engine row's (:data:`fp8rl_core.sampler.capabilities.CAPABILITIES`)
PYTHON_ENV = capabilities("sglang").interpreter.env
ENTRY = "fp8rl_core.sampler.sglang.compat"
LOG_LINES = 40
#: how long a flush after a weight update is asked again while SGLang's scheduler is not idle (seconds)
FLUSH_S = 30.0


def mxfp8_refusal(schemes: Mapping[str, str]) -> str | None:
    """Why an SGLang engine cannot serve ``schemes`` here (one line), or None: only BF16 layers run on it
    (:data:`fp8rl_core.sampler.capabilities.CAPABILITIES`)."""
    return refusal("sglang", schemes.values(), gpu=torch.cuda.is_available())


#: what SGLang's server logs when its ``--port`` was taken before it could bind it
PORT_TAKEN = "address already in use"


def _port() -> int:
    """A free local port below 55536: SGLang 0.5.12 derives a gRPC port ``--port`` + 10000 and refuses to start
    when that exceeds 65535 (even with gRPC off), so the OS's choice (up to 60999) will not do."""
    for port in random.Random().sample(range(20000, 55536), 200):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise SamplerError("no free local port in 20000-55535 for the SGLang server")


def _stop_group(proc: subprocess.Popen) -> None:
    """Stop the server's whole process group (its schedulers and detokenizer too): SIGTERM, then SIGKILL."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
            proc.wait(timeout=15)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass


class SglangSampler(Sampler):
    """One live SGLang server for one model with BF16 (or FP32) layers, ``tensor_parallel`` ranks, on CPU
    (``--device cpu``, the ``torch_native`` attention backend; a GPU engine is not wired yet).

    ``python``: the SGLang venv's interpreter (default: ``$FP8RL_SGLANG_PYTHON``); ``timeout_s``: the most
    any one call (and the start) may take. ``SamplerConfig.threads`` sets each scheduler's OpenMP threads.
    Log-probs are SGLang's before temperature (``SGLANG_RETURN_ORIGINAL_LOGPROB``): what the learner computes.
    """

    def __init__(self, checkpoint: str | Path, schemes: Mapping[str, str], initial: Mapping[str, torch.Tensor],
                 cfg: SamplerConfig = SamplerConfig(), *, version: int = 0, mx_grid: str = MX_GRID,
                 work_root: str | Path | None = None, seed: int = 0, tensor_parallel: int = 1,
                 python: str | Path | None = None, timeout_s: float = 600.0) -> None:
        self.cfg, self.schemes, self.mx_grid = cfg, dict(schemes), mx_grid
        self.proc: subprocess.Popen | None = None
        if (why := mxfp8_refusal(schemes)) is not None:
            raise SamplerError(why)
        if cfg.kv_cache_dtype != "auto":
            raise SamplerError(f"the SGLang engine takes kv_cache_dtype='auto' only, got {cfg.kv_cache_dtype!r}")
        python = python or os.environ.get(PYTHON_ENV)
        if not python or not Path(python).is_file():
            raise SamplerError(f"the SGLang engine needs the SGLang venv's interpreter: pass python= or set {PYTHON_ENV} "
                               f"(`make setup-sglang` builds .venv-sglang); got {python!r}")
        if tensor_parallel < 1:
            raise SamplerError(f"tensor_parallel must be at least 1, got {tensor_parallel}")
        self.tensor_parallel, self.timeout_s, self.in_process = tensor_parallel, float(timeout_s), False
        self.model_cfg = engine_config(checkpoint, schemes, mx_grid)
        self.key = "sglang-" + engine_key(self.model_cfg, cfg) + (f"-tp{tensor_parallel}" if tensor_parallel > 1 else "")
        self.vocab_size = int(self.model_cfg["vocab_size"])
        self.work_root = Path(work_root) if work_root is not None else default_root() / "fp8rl"
        from fp8rl_core.sampler.vllm.engine import prepare_engine_dir

        served = {k: v for k, v in self.model_cfg.items() if k != "quantization_config"}  # BF16 layers: no method
        self.dir = prepare_engine_dir(served, initial, self.work_root)
        self.log_path = self.dir / "server.log"
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="fp8rl-sglang")
        t0 = time.perf_counter()
        try:
            try:
                self._start(python, seed)
            except SamplerDeadError:
                if PORT_TAKEN not in self.log_tail():  # another process took the port before the server bound it
                    raise
                self._finalizer()  # that attempt's processes; then once more, on another port
                self._start(python, seed)
            self.startup_s = time.perf_counter() - t0
            self.version = self._one("set_version", version=version, names=sorted(initial))
        except BaseException:
            self.close()
            raise
        self.syncs, self.cache_resets = 0, 0
        self.instance = f"{self.key}-{self.proc.pid}-{id(self):x}-{time.monotonic_ns()}"

    # -- the server process ---------------------------------------------------------------------------
    def _start(self, python: str | Path, seed: int) -> None:
        cfg, tp = self.cfg, self.tensor_parallel
        self.port = _port()
        self.url = f"http://127.0.0.1:{self.port}"
        cores = os.cpu_count() or 1
        per = max(1, cores // tp)
        bind = "|".join(f"{(r * per) % cores}-{(r * per) % cores + per - 1}" if per > 1 else str(r % cores)
                        for r in range(tp))
        env = dict(os.environ, FP8RL_SGLANG_SERVER="1", FP8RL_SGLANG_PARENT=str(os.getpid()),
                   SGLANG_USE_CPU_ENGINE="1", SGLANG_CPU_OMP_THREADS_BIND=bind, SGLANG_RETURN_ORIGINAL_LOGPROB="1",
                   PYTHONUNBUFFERED="1",
                   PYTHONPATH=os.pathsep.join([str(Path(__file__).resolve().parents[3]),
                                               *filter(None, [os.environ.get("PYTHONPATH")])]))
        if cfg.threads is not None:
            env["OMP_NUM_THREADS"] = str(cfg.threads)
        tokens = max(cfg.max_model_len * cfg.max_num_seqs, int(cfg.kv_cache_gib * 2**30) // self._token_bytes())
        args = ["--model-path", str(self.dir), "--skip-tokenizer-init", "--device", "cpu", "--dtype", cfg.dtype,
                "--tp-size", str(tp), "--host", "127.0.0.1", "--port", str(self.port),
                "--attention-backend", "torch_native", "--sampling-backend", "pytorch", "--grammar-backend", "none",
                "--disable-cuda-graph", "--disable-overlap-schedule", "--skip-server-warmup",
                "--mem-fraction-static", str(cfg.memory_fraction), "--max-total-tokens", str(tokens),
                "--context-length", str(cfg.max_model_len), "--max-running-requests", str(cfg.max_num_seqs),
                "--random-seed", str(seed), "--custom-weight-loader", RPC, "--log-level", "warning",
                *([] if cfg.enable_prefix_caching else ["--disable-radix-cache"])]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen([str(python), "-m", ENTRY, *args], env=env, cwd=self.dir, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        self._finalizer = weakref.finalize(self, _stop_group, self.proc)  # an engine dropped unclosed stops too
        deadline = time.monotonic() + self.timeout_s
        while True:
            self._check_process("start")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                raise SamplerError(f"the SGLang server did not answer within {self.timeout_s:.0f} s; its log ends:\n"
                                   + self.log_tail())
            time.sleep(0.5)

    def _token_bytes(self) -> int:
        c = self.model_cfg
        head_dim = int(c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"])
        width = 4 if self.cfg.dtype == "float32" else 2
        return max(1, 2 * int(c["num_hidden_layers"]) * int(c["num_key_value_heads"]) * head_dim * width)

    def log_tail(self, lines: int = LOG_LINES) -> str:
        """The last ``lines`` lines of the server's log (its stdout and stderr, every rank's scheduler)."""
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(deque(f, maxlen=lines))
        except OSError:
            return "(no log)"

    def _check_process(self, what: str) -> None:
        if self.proc is None:
            raise SamplerDeadError(f"the SGLang engine was closed ({what} refused)")
        code = self.proc.poll()
        if code is not None:
            raise SamplerDeadError(f"the SGLang engine exited with code {code} during {what} (engine {self.key}, last "
                                   f"synced version {getattr(self, 'version', None)}); its weights are lost. Its log "
                                   f"ends:\n{self.log_tail()}")

    def _post(self, path: str, body: dict, what: str):
        """POST ``body`` as JSON; the answer's JSON. Fails fast if the server dies meanwhile, and never waits past
        ``timeout_s``."""
        self._check_process(what)
        data = json.dumps(body).encode()

        def send():
            req = urllib.request.Request(self.url + path, data=data, headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=self.timeout_s) as r:
                return json.loads(r.read() or b"null")

        future = self._pool.submit(send)
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                return future.result(timeout=0.2)
            except concurrent.futures.TimeoutError:
                self._check_process(what)
                if time.monotonic() > deadline:
                    raise SamplerError(f"the SGLang engine did not answer {what} within {self.timeout_s:.0f} s") from None
            except urllib.error.HTTPError as e:
                raise SamplerError(f"the SGLang engine refused {what}: HTTP {e.code}: "
                                   f"{e.read().decode(errors='replace')[:500]}") from None
            except (urllib.error.URLError, OSError, ConnectionError) as e:
                for _ in range(50):  # the connection broke: the server is going down; wait for its exit code
                    if self.proc.poll() is not None:
                        break
                    time.sleep(0.1)
                self._check_process(what)
                raise SamplerError(f"the SGLang engine's connection failed during {what}: {e}") from e

    # -- per-rank operations (.worker through .compat.rpc) --------------------------------------------
    def update_request(self, payloads: Sequence[str], *, flush_cache: bool, what: str) -> dict:
        """SGLang's ``/update_weights_from_tensor`` with one serialized payload per rank, fp8rl's loader named."""
        ans = self._post("/update_weights_from_tensor",
                         {"serialized_named_tensors": list(payloads), "load_format": RPC, "flush_cache": flush_cache},
                         what)
        if not (isinstance(ans, dict) and ans.get("success")):
            raise SamplerError(f"the SGLang engine refused {what}: {ans}")
        return ans

    def _ranks(self, calls: Sequence[tuple[str, dict]], *, flush_cache: bool = False) -> list:
        """Run ``calls[r]`` (operation, keyword args) on rank r; one answer per rank."""
        out = Path(tempfile.mkdtemp(prefix="fp8rl-sglang-rpc-", dir=self.work_root))
        try:
            payloads = []
            for op, args in calls:
                payloads.append(rpc_payload(json.dumps({"op": op, "args": args, "out": str(out)})))
            self.update_request(payloads, flush_cache=flush_cache, what=calls[0][0])
            answers = []
            for rank in range(len(calls)):
                path = out / f"rank{rank}.json"
                if not path.is_file():
                    raise SamplerError(f"SGLang rank {rank} gave no answer to {calls[rank][0]}")
                ans = json.loads(path.read_text())
                if not ans["ok"]:
                    raise SamplerError(f"SGLang rank {rank}: {calls[rank][0]} failed: {ans['error']}")
                answers.append(ans["result"])
            return answers
        finally:
            shutil.rmtree(out, ignore_errors=True)

    def rpc(self, op: str, *, flush_cache: bool = False, **args) -> list:
        """Operation ``op`` of :mod:`.worker` on every rank: one answer per rank."""
        return self._ranks([(op, args)] * self.tensor_parallel, flush_cache=flush_cache)

    def _one(self, op: str, **args):
        return self.rpc(op, **args)[0]

    # -- the seam -------------------------------------------------------------------------------------
    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def engine_version(self) -> list[int]:
        return [int(v) for v in self.rpc("version")]

    def layers(self) -> dict[str, dict]:
        return {}  # BF16 layers only: no quantization method on any layer

    def prefix_cache_blocks(self) -> int:
        """SGLang's radix cache reports no block count over HTTP: 0 right after a flush, -1 otherwise (unknown)."""
        return 0 if self._flushed else -1

    def reset_prefix_cache(self) -> bool:
        self._check_process("reset_prefix_cache")
        try:
            with urllib.request.urlopen(urllib.request.Request(self.url + "/flush_cache", method="POST"),
                                        timeout=self.timeout_s) as r:
                ok = r.status == 200
        except urllib.error.HTTPError:
            ok = False
        if ok:
            self.cache_resets += 1
            self._flushed = True
        return ok

    _flushed = True

    def _flush_after(self, what: str) -> None:
        """SGLang's radix cache flushed after a weight update, through ``/flush_cache``: SGLang flushes only
        while its scheduler is idle, and a request it has just finished can count as running for one more turn
        of its loop — a flush inside the update request (``flush_cache: true``) then fails an assertion that
        kills the scheduler, where ``/flush_cache`` answers a refusal. Asked again until it flushes, for up to
        :data:`FLUSH_S` seconds."""
        deadline = time.monotonic() + FLUSH_S
        while not self.reset_prefix_cache():
            if time.monotonic() > deadline:
                raise SamplerError(f"SGLang's radix cache was not flushed after {what}: its scheduler stayed busy "
                                   f"for {FLUSH_S:.0f} s; its log ends:\n{self.log_tail()}")
            time.sleep(0.05)

    def sync(self, tensors: Mapping[str, torch.Tensor], version: int, *, export_s: float = 0.0,
             hooks: SyncHooks = NO_HOOKS) -> SyncTiming:
        """Write ``tensors`` as a sync, load it in place on every rank (fp8rl's loader cuts each rank's shard),
        then flush SGLang's radix cache (unless the hooks skip the reset; :meth:`_flush_after`)."""
        timing = file_sync(tensors, version, self.cfg.bucket_mb, self.work_root / "sync", hooks,
                           lambda manifest: self.rpc("load", manifest=manifest),
                           lambda: self._flush_after(f"the sync to version {version}"), export_s=export_s)
        self.version, self.syncs = version, self.syncs + 1
        return timing

    def load_on_rank(self, rank: int, tensors: Mapping[str, torch.Tensor], version: int) -> dict:
        """Load ``tensors`` (full, sync names) on tensor-parallel ``rank`` only (the other ranks keep theirs):
        what a rank that missed a sync holds — for the per-rank checks' tests."""
        handle = write_sync(tensors, version, root=self.work_root / "sync")
        try:
            calls = [("load", {"manifest": str(handle.manifest)}) if r == rank else ("version", {})
                     for r in range(self.tensor_parallel)]
            answer = self._ranks(calls)[rank]
            self._flush_after(f"a load on rank {rank}")
            return answer
        finally:
            handle.remove()

    def state(self, *, fingerprints: bool = True) -> dict:
        ranks = self.rpc("state", fingerprints_too=fingerprints)
        return {"ranks": ranks, "cache_blocks": self.prefix_cache_blocks(), "cache_resets": self.cache_resets,
                "instance": self.instance}

    def read_back_rank(self, rank: int, names: Sequence[str] | None = None) -> dict[str, torch.Tensor]:
        """What tensor-parallel ``rank`` holds, by sync name (its shards)."""
        folder = Path(tempfile.mkdtemp(prefix="fp8rl-readback-", dir=self.work_root))
        try:
            calls = [("read", {"path": str(folder / f"r{r}.safetensors"), "names": None if names is None else
                               list(names)}) if r == rank else ("version", {}) for r in range(self.tensor_parallel)]
            self._ranks(calls)
            return load_file(str(folder / f"r{rank}.safetensors"))
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def read_back(self, names: Sequence[str] | None = None, *, effective: bool = False) -> dict[str, torch.Tensor]:
        """Rank 0's tensors by sync name; ``effective`` adds nothing (BF16 layers compute from what they hold)."""
        return self.read_back_rank(0, names)

    def compute_check(self, *, full: bool = False) -> list[dict]:
        return list(self.rpc("compute_check", full=bool(full)))

    def engine_checksums(self) -> dict[str, str] | None:
        """None: SGLang 0.5.12's own weight checker (``/weights_checker``, action ``checksum``) calls
        ``torch.cuda.synchronize()`` and is not available on CPU; fp8rl's per-rank fingerprints
        (:meth:`check_ranks`) are the check here."""
        return None

    def check_ranks(self, expected: Mapping[str, torch.Tensor], *, full: bool = False) -> list[RankCheck]:
        if full:
            handle = write_sync(expected, max(self.version, 0), root=self.work_root / "sync")
            try:
                results = self.rpc("check_rank", manifest=str(handle.manifest))
            finally:
                handle.remove()
        else:
            layout = ModelLayout.from_hf_config(self.model_cfg)
            tp = self.tensor_parallel
            fps = {str(r): slice_for_rank(expected, layout, r, tp).fingerprints for r in range(tp)}
            results = self.rpc("check_rank", fingerprints_by_rank=fps)
        return [RankCheck.from_dict(r) for r in results]

    def generate(self, prompt_ids: torch.Tensor, n: int, max_tokens: int, *, seed: int, eos_id: int | Sequence[int],
                 pad_id: int = 0, temperature: float | None = None, prompt_mask: torch.Tensor | None = None) -> Rollout:
        temperature = self.cfg.temperature if temperature is None else temperature
        rows = [row for row in prompt_rows(prompt_ids, prompt_mask) for _ in range(n)]  # grouped per prompt
        params = [{"max_new_tokens": max_tokens, "temperature": temperature, "stop_token_ids": stop_ids(eos_id),
                   "sampling_seed": seed + i, "skip_special_tokens": False} for i in range(len(rows))]
        t0 = time.perf_counter()
        outs = self._post("/generate", {"input_ids": rows, "sampling_params": params, "return_logprob": True},
                          "generate")
        seconds = time.perf_counter() - t0
        self._flushed = False
        b = len(rows)
        ids = torch.full((b, max_tokens), pad_id, dtype=torch.long)
        mask = torch.zeros((b, max_tokens), dtype=torch.long)
        logps = torch.zeros((b, max_tokens), dtype=torch.float32)
        cached = 0
        for row, out in enumerate(outs):
            meta = out["meta_info"]
            cached += int(meta.get("cached_tokens") or 0)
            toks = [int(t) for t in out["output_ids"]][:max_tokens]
            lps = [float(lp) for lp, _, *_ in meta["output_token_logprobs"]][: len(toks)]
            ids[row, : len(toks)] = torch.tensor(toks, dtype=torch.long)
            mask[row, : len(toks)] = 1
            logps[row, : len(lps)] = torch.tensor(lps, dtype=torch.float32)
        return Rollout(prompt_ids.repeat_interleave(n, dim=0), ids, mask, logps, self.version, seconds, cached)

    def limit_vocabulary(self, emittable: int | None) -> None:
        if emittable is not None:  # the config refuses it first (RunConfig._sglang_fits)
            raise SamplerError(f"fp8rl's SGLang engine cannot mask the ids from {emittable} on (a tokenizer shorter "
                               "than the vocabulary); use sampler.engine: vllm")

    def prompt_logprobs(self, sequences: torch.Tensor, *, full: bool = False) -> torch.Tensor:
        rows = [[int(t) for t in r] for r in sequences.tolist()]
        body = {"input_ids": rows, "sampling_params": {"max_new_tokens": 1, "temperature": 1.0},
                "return_logprob": True, "logprob_start_len": 0}
        if full:
            body["top_logprobs_num"] = self.vocab_size
        outs = self._post("/generate", body, "prompt_logprobs")
        t = len(rows[0]) - 1
        res = (torch.full((len(rows), t, self.vocab_size), -math.inf) if full else torch.zeros((len(rows), t)))
        for i, out in enumerate(outs):
            meta = out["meta_info"]
            given = meta["input_token_logprobs"][1:]  # position 0 has no prefix
            if [int(x[1]) for x in given] != rows[i][1:]:
                raise SamplerError("SGLang's input log-probs do not follow the given tokens")
            if full:
                for pos, entries in enumerate(meta["input_top_logprobs"][1:]):
                    idx = torch.tensor([int(e[1]) for e in entries], dtype=torch.long)
                    res[i, pos, idx] = torch.tensor([float(e[0]) for e in entries])
            else:
                res[i] = torch.tensor([float(x[0]) for x in given])
        return res

    # -- lifetime -------------------------------------------------------------------------------------
    def close(self) -> None:
        self.proc = None
        if (finalizer := getattr(self, "_finalizer", None)) is not None:
            finalizer()  # the server's whole process group (_stop_group)
        if (pool := getattr(self, "_pool", None)) is not None:
            pool.shutdown(wait=False, cancel_futures=True)
        if getattr(self, "dir", None) is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
