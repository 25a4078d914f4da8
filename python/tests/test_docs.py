"""Every shell, console and Python example in the README and docs/ runs, against the
repository's fixtures, and prints what the docs show.

Blocks run file by file, in order, in one scratch directory per file, where `tests`, `tools` and
`python` lead to the repository's and `mmq` on PATH is the command under test (MMQ_BIN), so a
block may use what an earlier block of the same page wrote. Fences:

- ```sh / ```bash: the lines run with `bash -euo pipefail`; they must succeed.
- ```console, or a fence without a language whose first line starts with `$ `: each `$ ` line
  runs and what it prints (stdout and stderr) must be the lines that follow it, where `...`
  inside a line stands for any text and a line of only `...` for any number of lines.
- ```python: runs with this interpreter; it must succeed.
- A ```toml or ```text block right after `<!-- docs-test: file NAME -->` is written to NAME
  for the blocks after it.
- `<!-- docs-test: skip REASON -->` right before a block: not run (it needs a GPU, TensorRT, or
  is the test command itself); the reason is required and printed.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import REPO

RUN = {"sh", "bash", "console", "python"}
MARK = re.compile(r"<!--\s*docs-test:\s*(skip|file)\s+(.+?)\s*-->")


@dataclass
class Block:
    page: Path
    line: int
    lang: str
    text: str
    mark: tuple[str, str] | None


def blocks(page: Path) -> list[Block]:
    out: list[Block] = []
    lines = page.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        fence = re.match(r"^```(\S*)\s*$", lines[i])
        if not fence:
            i += 1
            continue
        start = i
        j = i + 1
        while j < len(lines) and not lines[j].startswith("```"):
            j += 1
        body = "\n".join(lines[i + 1:j]) + "\n"
        lang = fence.group(1)
        if lang == "" and body.startswith("$ "):
            lang = "console"
        k = start - 1
        while k >= 0 and lines[k].strip() == "":
            k -= 1
        m = MARK.match(lines[k].strip()) if k >= 0 else None
        out.append(Block(page, start + 1, lang, body, (m.group(1), m.group(2)) if m else None))
        i = j + 1
    return out


def matches(want: list[str], got: list[str]) -> bool:
    """`got` is `want`, where `...` inside a line stands for any text and a line of only `...`
    for any number of lines."""
    parts = []
    for w in want:
        if w.strip() == "...":
            parts.append(r"(?:[^\n]*\n)*?")
        else:
            parts.append("[^\n]*".join(re.escape(p) for p in w.split("...")) + r"\n")
    return re.fullmatch("".join(parts), "".join(g + "\n" for g in got)) is not None


def sandbox(tmp: Path, mmq_bin: Path) -> dict[str, str]:
    for name in ("tests", "tools", "python"):
        (tmp / name).symlink_to(REPO / name)
    bindir = tmp / ".bin"
    bindir.mkdir()
    (bindir / "mmq").symlink_to(Path(mmq_bin).resolve())
    env = dict(os.environ)
    env["PATH"] = f"{bindir}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "python" / "tests"),
                                                      env.get("PYTHONPATH")]))
    return env


def run_console(block: Block, cwd: Path, env: dict[str, str]) -> None:
    steps: list[tuple[str, list[str]]] = []
    for line in block.text.splitlines():
        if line.startswith("$ "):
            steps.append((line[2:], []))
        elif steps:
            steps[-1][1].append(line)
        else:
            raise AssertionError(f"{block.page.name}:{block.line}: output before any `$ ` line")
    for cmd, want in steps:
        r = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], cwd=cwd, env=env,
                           capture_output=True, text=True, timeout=600)
        got = (r.stdout + r.stderr).splitlines()
        for lines in (want, got):
            while lines and lines[-1] == "":
                lines.pop()
        assert matches(want, got), (
            f"{block.page.name}:{block.line}: `{cmd}` printed\n" + "\n".join(got)
            + "\n-- the docs show --\n" + "\n".join(want))


ALL_PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
# The pages with examples (a page without any has nothing to run).
PAGES = [p for p in ALL_PAGES if any(b.lang in RUN or b.mark for b in blocks(p))]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_examples_run(page: Path, tmp_path: Path, mmq_bin: Path) -> None:
    env = sandbox(tmp_path, mmq_bin)
    ran = 0
    for b in blocks(page):
        if b.mark and b.mark[0] == "skip":
            print(f"{page.name}:{b.line}: not run: {b.mark[1]}")
            continue
        if b.mark and b.mark[0] == "file":
            (tmp_path / b.mark[1]).write_text(b.text, encoding="utf-8")
            continue
        if b.lang not in RUN:
            continue
        where = f"{page.name}:{b.line}"
        if b.lang == "console":
            run_console(b, tmp_path, env)
        else:
            cmd = [sys.executable, "-c", b.text] if b.lang == "python" else [
                "bash", "-euo", "pipefail", "-c", b.text]
            r = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True,
                               timeout=900)
            assert r.returncode == 0, f"{where}: exit {r.returncode}\n{r.stdout}\n{r.stderr}"
        ran += 1
    print(f"{page.name}: {ran} example(s) ran")
    assert ran > 0 or all(b.mark for b in blocks(page) if b.lang in RUN), page.name


def test_every_skip_says_why() -> None:
    for page in ALL_PAGES:
        for b in blocks(page):
            if b.mark and b.mark[0] == "skip":
                assert len(b.mark[1]) > 10, f"{page.name}:{b.line}: a skip needs a reason"
