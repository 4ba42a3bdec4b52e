"""The front door stays small and the docs' links lead somewhere: README.md ≤ 12 KB (reference material lives
in docs/), and every relative link of README.md and the pages under docs/, bench/ and tests/ names a file of
the checkout and, with ``#anchor``, a heading of that file (GitHub's heading ids).

docs/design.md's lists are held to the code: its commands to the ``fp8rl`` Typer app (and the CLI module's own
usage lines, and docs/configs.md's table of the command), its configs to ``configs/*.yaml``, its layer table to the ranks tests/core/test_purity.py
enforces, its purity rule to that test's forbidden packages and lazy exception, the modules it names to the checkout,
the engine seam's operations to ``Sampler``'s abstract methods, the modules it says import SGLang to those that do;
the flows judge nothing."""

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


# ------------------------------------------------------------------------------- docs/design.md, held to the code
DESIGN = ROOT / "docs" / "design.md"


def _section(text: str, heading: str) -> str:
    """The body of the Markdown section ``heading`` (to the next heading of any level)."""
    m = re.search(rf"^#+ {re.escape(heading)}\n(.*?)(?=^#)", text, re.S | re.M)
    assert m, f"docs/design.md has no section {heading!r}"
    return m.group(1)


def _shape_entry(folder: str) -> str:
    """The text of ``folder``'s entry in the Shape block of design.md (to the next top-level entry)."""
    block = _section(DESIGN.read_text(), "Shape")
    m = re.search(rf"^{re.escape(folder)}\s(.*?)(?=^\S)", block, re.S | re.M)
    assert m, f"docs/design.md's Shape block has no entry {folder}"
    return m.group(1)


def cli_commands() -> set[str]:
    """The commands of the ``fp8rl`` Typer app, by the names a user types (a group, ``nightly``, by its name)."""
    from flows.cli import app

    return ({c.name or c.callback.__name__.replace("_", "-") for c in app.registered_commands}
            | {g.name for g in app.registered_groups})


def test_the_design_pages_command_list_is_the_cli():
    commands = _section(DESIGN.read_text(), "Commands")
    listed = re.search(r"the `fp8rl` command\s*\(([^)]*)\)", commands)
    assert listed, "docs/design.md, Commands: no '(…)' list after 'the `fp8rl` command'"
    assert set(re.findall(r"`([a-z-]+)`", listed.group(1))) == cli_commands()
    import flows.cli

    usage = set(re.findall(r"^\s+fp8rl ([a-z-]+)", flows.cli.__doc__, re.M))
    assert usage == cli_commands(), "flows/cli.py's docstring lists other commands than its app has"
    reference = set(re.findall(r"^\| `fp8rl ([a-z-]+)", (ROOT / "docs" / "configs.md").read_text(), re.M))
    assert reference == cli_commands(), "docs/configs.md's table of the fp8rl command lists other commands"


def test_the_design_pages_config_list_is_the_configs_folder():
    listed = set(re.findall(r"`([a-z0-9-]+)`", _shape_entry("configs/")))
    assert listed == {p.stem for p in (ROOT / "configs").glob("*.yaml")}


def test_the_design_pages_layer_table_is_the_purity_tests():
    from tests.core.test_purity import LAYERS

    table = _section(DESIGN.read_text(), "Layers")
    doc: dict[str, int] = {}
    for rank, names in re.findall(r"^\| (\d+) \| (.*) \|$", table, re.M):
        for name in re.findall(r"`([a-z_]+)`", names):
            doc[name if name in ("adapters", "tasks", "flows") else f"fp8rl_core.{name}"] = int(rank)
    assert doc == LAYERS


def test_the_docs_state_the_purity_rule_the_purity_test_enforces():
    """fp8rl_core imports none of FORBIDDEN, but the lazy imports LAZY_ALLOWED grants a subpackage: the design
    page says both; no page claims the library has no Ray imports at all."""
    from tests.core.test_purity import FORBIDDEN, LAZY_ALLOWED

    names = {"prefect": "Prefect", "mlflow": "MLflow", "ray": "Ray"}
    entry = " ".join(re.split(r"\n  (?=\S)", _shape_entry("fp8rl_core/"))[0].split())  # its own lines, not its modules'
    assert set(names) == FORBIDDEN and all(names[f] in entry for f in FORBIDDEN), entry
    for sub, allowed in LAZY_ALLOWED.items():  # "… and Ray only inside functions of fp8rl_core/verl/"
        for f in allowed:
            assert re.search(rf"{names[f]} only inside functions of fp8rl_core/{sub}/", entry), entry
    claims = [ROOT / "fp8rl_core" / "__init__.py", *PAGES]
    false = re.compile(r"(?<!loads )no Prefect, MLflow or Ray\b")  # ("importing … loads no …, Ray" is true)
    assert [p.relative_to(ROOT).as_posix() for p in claims if false.search(p.read_text())] == []


def test_the_flows_judge_nothing():
    """Flows only compose: what a stage plans and judges is the library's (fp8rl_core.correctness_series), so no
    module of flows/ imports the checks' verdicts."""
    from tests.core.test_purity import imports_in

    judging = ("fp8rl_core.checks", "fp8rl_core.verl.verdicts")
    found = [f"{p.name}:{line} {m}" for p in sorted((ROOT / "flows").glob("*.py")) for line, m in imports_in(p, ROOT)
             if m.startswith(judging)]
    assert found == []


DESIGN = ROOT / "docs" / "design.md"


def _tracked() -> list[str]:
    import subprocess

    return subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()


def test_every_module_design_md_names_is_in_the_checkout():
    """Each file name design.md's prose and shape give (``seam.py``, ``sampler/vllm/worker.py``, …) is a tracked
    file of that name or path, and each dotted name (``fp8rl_core.sampler.seam.Sampler``) a module with that name
    defined in it: a moved or renamed module fails here, not in a reader's search."""
    text, files = DESIGN.read_text(), _tracked()
    named = sorted(set(re.findall(r"(?<![\w./-])([A-Za-z_][\w/-]*\.py)\b", text)))
    assert named and [t for t in named if not any(f == t or f.endswith("/" + t) for f in files)] == []
    wrong = []
    for dotted in sorted(set(re.findall(r"`((?:fp8rl_core|adapters|flows|tasks)(?:\.\w+)+)`", text))):
        parts = dotted.split(".")
        for i in range(len(parts), 0, -1):
            base = ROOT.joinpath(*parts[:i])
            module = base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"
            if module.is_file():
                break
        else:
            wrong.append(f"{dotted}: no module")
            continue
        if parts[i:] and not re.search(rf"^\s*(?:class|def|async def)\s+{parts[i]}\b|^\s*{parts[i]}\s*[:=]|import .*\b{parts[i]}\b",
                                       module.read_text(), re.M):
            wrong.append(f"{dotted}: {parts[i]} not in {module.relative_to(ROOT)}")
    assert wrong == []


def test_the_seams_operations_in_design_md_are_the_seams_abstract_methods():
    """design.md's list of the engine seam's operations is ``Sampler``'s abstract methods, no more, no fewer."""
    import ast

    tree = ast.parse((ROOT / "fp8rl_core" / "sampler" / "seam.py").read_text())
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Sampler"]
    abstract = {f.name for f in cls.body if isinstance(f, ast.FunctionDef)
                and any(getattr(d, "id", getattr(d, "attr", None)) == "abstractmethod" for d in f.decorator_list)}
    paragraph = DESIGN.read_text().split("**The seam.**", 1)[1].split("and the attributes every engine sets", 1)[0]
    listed = set(re.findall(r"`(\w+)`", paragraph.split("naming its operations:", 1)[1]))
    assert listed == abstract, (sorted(listed - abstract), sorted(abstract - listed))


def test_the_modules_design_md_says_import_sglang_are_the_ones_that_do():
    """"`compat.py` and `loader.py` are the only modules that import SGLang": the modules of the project that do."""
    m = re.search(r"((?:`\w+\.py`(?:,\s+|\s+and\s+)?)+) are the only modules that\s+import SGLang", DESIGN.read_text())
    assert m, "design.md no longer says which modules import SGLang"
    said = set(re.findall(r"`(\w+\.py)`", m.group(1)))
    importing = {p.name for folder in ("fp8rl_core", "adapters", "tasks", "flows") for p in (ROOT / folder).rglob("*.py")
                 if re.search(r"^\s*(?:from|import) sglang\b", p.read_text(), re.M)}
    assert importing == said
