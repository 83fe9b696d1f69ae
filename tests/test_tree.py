"""docs/ARCHITECTURE.md's annotated file tree is the map a newcomer reads: every product module (and every
file of the kernels' C source) stands in it with a line, and every file it names exists."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENTRY = re.compile(r"^((?:│   |    )*)(?:├── |└── )(\S+)")


def tree_paths(markdown: str) -> set[str]:
    """The paths the tree under "## The file tree" draws (folders end with /), from its ├── / └── lines."""
    block = markdown.split("## The file tree", 1)[1].split("```", 2)[1]
    paths: set[str] = set()
    stack: list[str] = []
    for line in block.splitlines():
        m = ENTRY.match(line)
        if m:
            name = m.group(2)
            stack = stack[: len(m.group(1)) // 4] + [name.rstrip("/")]
            paths.add("/".join(stack) + ("/" if name.endswith("/") else ""))
    return paths


def should_be_drawn(tracked: list[str]) -> list[str]:
    """Every tracked Python module outside tests/ (package faces, __init__.py, may stand in their folder's
    line) and every file of kernels/c/."""
    return [
        f
        for f in tracked
        if (f.endswith(".py") or f.startswith("kernels/c/")) and not f.startswith("tests/") and not f.endswith("/__init__.py")
    ]


def test_every_module_stands_in_the_tree_and_every_entry_exists():
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    drawn = tree_paths((ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8"))
    assert {"graft_core/model.py", "kernels/c/arch/avx2.h", "services/store.py", "web/"} <= drawn
    missing = sorted(f for f in should_be_drawn(tracked) if f not in drawn)
    assert missing == [], f"add a line for each to docs/ARCHITECTURE.md's file tree: {missing}"
    stale = sorted(p for p in drawn if not p.endswith("/") and not (ROOT / p).exists())
    assert stale == [], f"the tree names files that are not there: {stale}"


def test_the_tree_reader_sees_nesting_and_a_missing_file():
    doc = "## The file tree\n\n```\n.\n├── a/      x\n│   ├── b.py   y\n│   └── c/\n│       └── d.h\n└── e.py\n```\n"
    assert tree_paths(doc) == {"a/", "a/b.py", "a/c/", "a/c/d.h", "e.py"}
    assert [f for f in should_be_drawn(["a/b.py", "a/z.py", "a/__init__.py", "tests/t.py"]) if f not in tree_paths(doc)] == [
        "a/z.py"
    ]
