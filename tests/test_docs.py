"""The front door stays small and the docs' links lead somewhere: README.md ≤ 12 KB (reference material lives
in docs/), and every relative link of README.md and the pages under docs/, bench/ and tests/ names a file of
the checkout and, with ``#anchor``, a heading of that file (GitHub's heading ids)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = sorted({README, ROOT / "bench" / "README.md", ROOT / "tests" / "BUDGET.md",
                *(ROOT / "docs").glob("*.md"), *(ROOT / "docs" / "results").glob("*.md")})
README_MAX_BYTES = 12 * 1024

_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def anchors(page: Path) -> set[str]:
    """The ids GitHub gives the headings of ``page``: lower case, punctuation dropped, spaces to hyphens,
    a repeated id suffixed ``-1``, ``-2`` …"""
    out: set[str] = set()
    for line in _FENCE.sub("", page.read_text()).splitlines():
        m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        slug = re.sub(r"[^\w\- ]", "", m.group(1).lower()).replace(" ", "-")
        base, n = slug, 0
        while slug in out:
            n += 1
            slug = f"{base}-{n}"
        out.add(slug)
    return out


def links(page: Path) -> list[str]:
    """The relative link targets of ``page`` outside code blocks."""
    text = _FENCE.sub("", page.read_text())
    return [t for t in _LINK.findall(text) if not re.match(r"[a-z][a-z0-9+.-]*:", t)]


def test_the_readme_is_at_most_12_kb():
    size = len(README.read_bytes())
    assert size <= README_MAX_BYTES, f"README.md is {size} bytes (> {README_MAX_BYTES}): move reference material to docs/"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_resolves(page: Path):
    broken = []
    for target in links(page):
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor:
            if dest.is_dir():
                dest = dest / "README.md"
            if dest.suffix != ".md" or anchor not in anchors(dest):
                broken.append(f"{target}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_the_anchor_rule_is_githubs():
    page = ROOT / "docs" / "gpu.md"
    ids = anchors(page)
    assert {"environments-decision", "launching-fp8rl-run-with-backend-verl", "verl-on-cpu"} <= ids
