"""Content identities: the SHA-256 of a value's canonical JSON (sorted keys), as hex, cut to a length —
what makes a run id, a spec hash, a warm-start or engine key the same on every machine. Each id keeps
the JSON form it was first computed with (``compact``), so ids recorded before stay the same."""

from __future__ import annotations

import hashlib
import json
from typing import Any

__all__ = ["canonical_json", "content_hash", "digest"]


def digest(text: str, length: int | None = None) -> str:
    """The SHA-256 hex digest of ``text`` (UTF-8), its first ``length`` digits (None: all 64)."""
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def canonical_json(value: Any, *, compact: bool = True) -> str:
    """``value`` as JSON with sorted keys — without whitespace (``compact``), else with ``json.dumps``'s
    default separators; a value JSON has no form for becomes its ``str``."""
    return json.dumps(value, sort_keys=True, separators=(",", ":") if compact else None, default=str)


def content_hash(value: Any, length: int | None = None, *, compact: bool = True) -> str:
    """:func:`digest` of :func:`canonical_json` — the identity of a value by its contents."""
    return digest(canonical_json(value, compact=compact), length)
