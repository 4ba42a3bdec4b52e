"""verl's plugin entry point (``verl.plugins``, pyproject.toml): registers fp8rl's CPU platform
(:mod:`fp8rl_core.verl.platform`) in every process at ``import verl``.

verl 0.9.1 imports each ``verl.plugins`` entry point while ``verl`` itself is being imported. This module
exists so that registration is the import's own effect: were the entry point the platform module, a process
that imported ``fp8rl_core.verl.platform`` before ``verl`` would find it already loaded when verl's plugin
discovery ran, nothing would register, and verl would fall back to its CUDA platform (CUDA IPC on a CPU
host: a weight transfer that waits forever). Nothing else imports this module."""

from __future__ import annotations

from fp8rl_core.verl.platform import register

register()
