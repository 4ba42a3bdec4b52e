"""Transport: sync tensors handed to the engine's processes as files, in size-bounded buckets.

Rule: tensors do not survive ``collective_rpc`` arguments, so a sync writes safetensors buckets (by
default under ``/dev/shm``) and passes the path of a JSON manifest carrying the version; buckets close
at ``bucket_bytes``, so a reader holds one bucket and a dropped bucket drops a known set of names; a
sync's folder is removed once loaded, or at exit. The format in full: :func:`write_sync`.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

__all__ = ["FORMAT", "SyncHandle", "default_root", "read_manifest", "read_sync", "write_sync"]

FORMAT = "fp8rl-sync/1"
MANIFEST = "manifest.json"


def default_root() -> Path:
    """``/dev/shm`` where it exists and is writable (memory-backed), else the system temp folder."""
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())


@dataclass(frozen=True)
class SyncHandle:
    """What crosses the process boundary: the manifest's path (plus facts for logs)."""

    manifest: Path
    version: int
    total_bytes: int
    buckets: int

    def remove(self) -> None:
        _LIVE.discard(self.manifest.parent)
        shutil.rmtree(self.manifest.parent, ignore_errors=True)


#: sync folders this process wrote and has not removed yet (removed at exit, see :func:`write_sync`)
_LIVE: set[Path] = set()


@atexit.register
def _remove_left_over() -> None:
    for folder in list(_LIVE):
        shutil.rmtree(folder, ignore_errors=True)
    _LIVE.clear()


def write_sync(
    tensors: Mapping[str, torch.Tensor], version: int, *, bucket_bytes: int = 64 << 20, root: str | Path | None = None
) -> SyncHandle:
    """Write ``tensors`` as buckets plus a manifest in a fresh folder under ``root``; return its handle.

    Tensors do not survive ``collective_rpc`` arguments (docs/design.md, Engines), so a sync writes its tensors
    to safetensors files — by default under ``/dev/shm`` (memory-backed: the copy is a memory copy, and
    the reader maps the pages) — and passes the *path of a manifest*. The manifest is JSON::

        {"format": "fp8rl-sync/1", "version": 7, "total_bytes": …,
         "buckets": [{"file": "bucket-0000.safetensors", "bytes": …, "names": [...]}, …]}

    Buckets are filled in the exporter's order and closed when the next tensor would take them past
    ``bucket_bytes`` (a tensor larger than a bucket gets a bucket of its own), so the reader's peak
    memory is one bucket and a dropped bucket drops a known set of names. :func:`read_sync` yields
    ``(name, tensor)`` in manifest order and checks that every listed name is present.

    Memory. Files under ``/dev/shm`` are RAM until deleted, so a sync's folder lives only until the engine
    has loaded it: the caller removes it (:meth:`SyncHandle.remove`, in a ``finally``), and any folder this
    process wrote and did not remove — an exception between write and remove, an interpreter exit in between
    — is removed when the process exits (:func:`atexit`; only a killed process can leave one behind, under a
    name that says what it was: ``fp8rl-sync-v<version>-…``).
    """
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
    if not isinstance(version, int) or version < 0:
        raise ValueError(f"version must be a non-negative int, got {version!r}")
    root = Path(root) if root is not None else default_root()
    root.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix=f"fp8rl-sync-v{version}-", dir=root))
    _LIVE.add(folder)
    buckets: list[dict] = []
    current: dict[str, torch.Tensor] = {}
    size = 0

    def flush() -> None:
        nonlocal current, size
        if not current:
            return
        fname = f"bucket-{len(buckets):04d}.safetensors"
        save_file(current, str(folder / fname), metadata={"version": str(version)})
        buckets.append({"file": fname, "bytes": size, "names": list(current)})
        current, size = {}, 0

    total = 0
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"sync tensor {name!r} is a {type(t).__name__}, not a tensor")
        nbytes = t.numel() * t.element_size()
        if current and size + nbytes > bucket_bytes:
            flush()
        current[name] = t.detach().cpu().contiguous()
        size += nbytes
        total += nbytes
    flush()
    manifest = {"format": FORMAT, "version": version, "total_bytes": total, "buckets": buckets}
    path = folder / MANIFEST
    path.write_text(json.dumps(manifest))
    return SyncHandle(path, version, total, len(buckets))


def read_manifest(path: str | Path) -> dict:
    path = Path(path)
    m = json.loads(path.read_text())
    if m.get("format") != FORMAT:
        raise ValueError(f"{path}: not an fp8rl sync manifest (format {m.get('format')!r}, expected {FORMAT!r})")
    return m


def read_sync(path: str | Path) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor of the sync at manifest ``path``, bucket by bucket, in the exporter's order."""
    path = Path(path)
    m = read_manifest(path)
    for b in m["buckets"]:
        file = path.parent / b["file"]
        if not file.is_file():
            raise FileNotFoundError(f"sync bucket {file} listed in {path} is missing ({len(b['names'])} tensors)")
        with safe_open(str(file), framework="pt") as f:
            present = set(f.keys())
            lost = [n for n in b["names"] if n not in present]
            if lost:
                raise ValueError(f"sync bucket {file} lacks {len(lost)} listed tensors, e.g. {lost[:3]}")
            for name in b["names"]:
                yield name, f.get_tensor(name)
