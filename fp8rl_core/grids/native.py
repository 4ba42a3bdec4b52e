"""The compiled MXFP8 kernels: ``mx_kernel.c`` built with the system C compiler and called through ctypes —
quantization (:func:`mx_quantize_native`) and rowwise dequantization (:func:`mx_dequantize_native`: a CPU
engine's compute copies at every sync).

Why a C kernel: the quantization is one read of the input and one write of data and scales, but
neither eager PyTorch (a dozen passes with temporaries, each paying page faults on fresh memory) nor
the ``torch.compile`` kernel (two passes over the input, the per-block scale recomputed for every
8-element vector) gets near that on CPU; bench/README.md has the profile. The C file is plain C99 with
no Python or torch headers, so it builds in well under a second with ``cc -O3 -march=native`` (no
``torch.utils.cpp_extension``, no ABI coupling) and is loaded with ctypes, which releases the GIL: the
blocks are split across ``torch.get_num_threads()`` Python threads.

Where it lives: built on first use (or by ``python -m fp8rl_core.grids.native``, which ``make setup``
runs) into ``$FP8RL_KERNEL_CACHE`` (default ``~/.cache/fp8rl/kernels``), under a name that hashes the
source, the flags and the CPU's feature flags, written atomically (concurrent first uses are safe).
No compiler, a failed build or an unsupported input (not bf16/fp32, not contiguous) → ``None`` from
:func:`mx_quantize_native`, and :mod:`.mx` falls back to its PyTorch path, which stays the readable
reference; the tests compare the two byte for byte.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from .formats import FP8Format

__all__ = ["kernel_path", "load", "mx_dequantize_native", "mx_quantize_native"]

SOURCE = Path(__file__).with_name("mx_kernel.c")
FLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-fno-fast-math", "-shared", "-fPIC", "-std=gnu99")
RULES = {"rceil": 0, "floor": 1, "ceil": 2, "even": 3}
MIN_BLOCKS_PER_THREAD = 1 << 14  # 512 K elements: below this one thread does it all


class _Params(ctypes.Structure):
    _fields_ = [("mbits", ctypes.c_int32), ("bias", ctypes.c_int32), ("emax", ctypes.c_int32),
                ("rule", ctypes.c_int32), ("propagate", ctypes.c_int32), ("max_bits", ctypes.c_uint32),
                ("max_norm_rcp", ctypes.c_float)]


def _compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.processor()


def kernel_path() -> Path:
    """Where the built kernel for this source, these flags and this CPU lives (built or not)."""
    root = Path(os.environ.get("FP8RL_KERNEL_CACHE") or Path.home() / ".cache" / "fp8rl" / "kernels")
    key = hashlib.sha256(SOURCE.read_bytes() + " ".join(FLAGS).encode() + _cpu_flags().encode()
                         + platform.machine().encode()).hexdigest()[:16]
    return root / f"mx_kernel-{key}.so"


def build() -> Path:
    """Compile ``mx_kernel.c`` into :func:`kernel_path` (no-op when it exists); raises on failure."""
    out = kernel_path()
    if out.exists():
        return out
    cc = _compiler()
    if cc is None:
        raise RuntimeError("no C compiler (cc, gcc or clang) on PATH; set CC")
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    os.close(fd)
    try:
        subprocess.run([cc, *FLAGS, str(SOURCE), "-o", tmp], check=True, capture_output=True, text=True)
        os.replace(tmp, out)  # atomic: a concurrent builder sees the whole file or none
    except subprocess.CalledProcessError as exc:
        raise RuntimeError(f"building {SOURCE.name} failed:\n{exc.stderr}") from exc
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


@functools.lru_cache(maxsize=1)
def load() -> ctypes.CDLL | None:
    """The loaded kernel library, building it if needed; ``None`` when it cannot be built or loaded."""
    if os.environ.get("FP8RL_QUANT_NATIVE", "auto").lower() == "never":
        return None
    try:
        lib = ctypes.CDLL(str(build()))
    except (OSError, RuntimeError) as exc:
        warnings.warn(f"the native MXFP8 kernel is unavailable ({exc}); using the PyTorch path", stacklevel=2)
        return None
    for name, elem in (("mx_quantize_f32", ctypes.c_float), ("mx_quantize_bf16", ctypes.c_uint16)):
        fn = getattr(lib, name)
        fn.argtypes = [ctypes.POINTER(elem), ctypes.c_int64, ctypes.POINTER(ctypes.c_uint8),
                       ctypes.POINTER(ctypes.c_uint8), ctypes.POINTER(_Params)]
        fn.restype = None
    f32 = ctypes.POINTER(ctypes.c_float)
    lib.mx_dequantize.argtypes = [ctypes.POINTER(ctypes.c_uint8), ctypes.c_int64, f32, f32, f32]
    lib.mx_dequantize.restype = None
    return lib


@functools.lru_cache(maxsize=None)
def _params(fmt: FP8Format, rule: str, nan: str) -> _Params:
    max_bits = torch.tensor(fmt.max, dtype=torch.float32).view(torch.int32).item()
    return _Params(fmt.mbits, fmt.bias, fmt.emax, RULES[rule], int(nan == "propagate"), max_bits,
                   fmt.max_norm_rcp)


_POOL: ThreadPoolExecutor | None = None


def _pool(n: int) -> ThreadPoolExecutor:
    global _POOL
    if _POOL is None or _POOL._max_workers < n:  # noqa: SLF001 — grow only
        _POOL = ThreadPoolExecutor(max_workers=n, thread_name_prefix="fp8rl-mx")
    return _POOL


def _split(n: int, run) -> None:
    """``run(lo, hi)`` over ``n`` blocks: on ``torch.get_num_threads()`` threads, each at least
    :data:`MIN_BLOCKS_PER_THREAD` blocks (the kernels release the GIL)."""
    threads = max(1, min(torch.get_num_threads(), n // MIN_BLOCKS_PER_THREAD))
    if threads == 1:
        run(0, n)
    else:
        cuts = [n * i // threads for i in range(threads + 1)]
        list(_pool(threads).map(run, cuts[:-1], cuts[1:]))


def mx_quantize_native(xb: torch.Tensor, fmt: FP8Format, rule: str, nan: str) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Quantize ``[n, 32]`` blocks with the C kernel → (fp8 data, uint8 scales), or ``None`` if unavailable."""
    if xb.device.type != "cpu" or xb.dtype not in (torch.bfloat16, torch.float32) or not xb.is_contiguous():
        return None
    lib = load()
    if lib is None:
        return None
    n = xb.shape[0]
    data = torch.empty(n, 32, dtype=torch.uint8)
    scales = torch.empty(n, dtype=torch.uint8)
    if xb.dtype == torch.bfloat16:
        fn, elem, x = lib.mx_quantize_bf16, ctypes.c_uint16, xb.view(torch.int16)
    else:
        fn, elem, x = lib.mx_quantize_f32, ctypes.c_float, xb
    params = ctypes.byref(_params(fmt, rule, nan))
    u8 = ctypes.POINTER(ctypes.c_uint8)

    def run(lo: int, hi: int) -> None:
        fn(ctypes.cast(x.data_ptr() + lo * 32 * x.element_size(), ctypes.POINTER(elem)), hi - lo,
           ctypes.cast(data.data_ptr() + lo * 32, u8), ctypes.cast(scales.data_ptr() + lo, u8), params)

    _split(n, run)
    return data.view(fmt.dtype), scales


@functools.lru_cache(maxsize=None)
def _lut(dtype: torch.dtype) -> torch.Tensor:
    """The 256 fp32 values of an FP8 element format's bytes, as torch converts them."""
    return torch.arange(256, dtype=torch.int32).to(torch.uint8).view(dtype).to(torch.float32)


def mx_dequantize_native(data: torch.Tensor, scale: torch.Tensor) -> torch.Tensor | None:
    """``fp32(data) · scale`` per block of 32 along the last dim with the C kernel (``data`` FP8 [..., K],
    K a multiple of 32; ``scale`` the blocks' fp32 multipliers [..., K/32]), or ``None`` if unavailable."""
    if data.device.type != "cpu" or data.dtype.itemsize != 1 or not data.is_floating_point() \
            or data.shape[-1] % 32 or scale.dtype != torch.float32:
        return None
    lib = load()
    if lib is None:
        return None
    q, s = data.contiguous(), scale.contiguous()
    n = q.numel() // 32
    out = torch.empty(q.shape, dtype=torch.float32)
    lut = _lut(q.dtype)
    u8, f32 = ctypes.POINTER(ctypes.c_uint8), ctypes.POINTER(ctypes.c_float)

    def run(lo: int, hi: int) -> None:
        lib.mx_dequantize(ctypes.cast(q.data_ptr() + lo * 32, u8), hi - lo, ctypes.cast(s.data_ptr() + lo * 4, f32),
                          ctypes.cast(lut.data_ptr(), f32), ctypes.cast(out.data_ptr() + lo * 128, f32))

    _split(n, run)
    return out


if __name__ == "__main__":  # make setup: build once so first use does not pay the compile
    lib = load()
    print(f"fp8rl MXFP8 kernel: {kernel_path() if lib is not None else 'unavailable (PyTorch fallback)'}")
