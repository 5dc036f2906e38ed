"""Docs that stay true: every code block of README.md, docs/tutorial.md and docs/presets.md runs, in document order,
in one scratch directory, and where a ```text block follows a block it must be what the block prints.

How a block runs:

- A ```python block is saved under the file name its text gives ("Save as `my_routing.py`", or
  "(`train_slo.py`, ...)") so that later blocks can import it, else under a name of its own; it is
  run with ``python FILE`` unless a later ```bash block runs it (``python show_card.py ...``).
- A ```bash block runs in bash with the environment's ``mooncake-gym`` on the PATH; ``source`` and
  ``mkdir`` lines (the reader's set-up) are left out, ``/path/to/mooncake-gym`` is this checkout.
- A block of no language (a layout or a ``make`` target) is not code and is not run.

Comments placed just before a block in the Markdown (invisible when rendered) say more:

- ``<!-- docs-test: skip: REASON -->``: not run (for example a command that needs a downloaded trace);
  the reason must be given.
- ``<!-- docs-test: cpu-dependent -->``: runs, but its printed output is not compared (PPO training:
  the numbers depend on the CPU; the text around it says so and gives a range).
- ``<!-- docs-test: quick: OLD => NEW; ... -->``: text replaced for the test run only (training
  budgets: the test shows that the code runs, not what 50,000 steps learn).

``DOCS_TEST_FULL=1`` runs the blocks as written (no ``quick`` replacements) and compares the
cpu-dependent outputs too, reporting every difference: how the tutorial's figures are re-measured
(several minutes). Output comparison is line by line after trailing spaces; a line of the
expected text that starts with ``note:`` is looked for on stderr (where the commands print notes).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ["README.md", "docs/tutorial.md", "docs/presets.md"]
FULL = os.environ.get("DOCS_TEST_FULL", "") not in ("", "0")
_FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```[ \t]*$", re.S | re.M)
_DIRECTIVE = re.compile(r"<!--\s*docs-test:\s*(.*?)\s*-->", re.S)
_SAVE_AS = re.compile(r"`([\w.-]+\.py)`")


@dataclass
class Block:
    doc: str
    line: int
    language: str
    code: str
    before: str  # the Markdown between the previous block and this one
    skip: str | None = None
    cpu_dependent: bool = False
    quick: list = field(default_factory=list)
    expected: str | None = None  # the ```text block that follows, if any
    filename: str | None = None


def parse(doc: str) -> list[Block]:
    """The code blocks of ``doc`` with their directives, file names and expected outputs."""
    text = (ROOT / doc).read_text()
    blocks: list[Block] = []
    end = 0
    for m in _FENCE.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        before = text[end:m.start()]
        block = Block(doc, line, m.group(1), m.group(2), before)
        for directive in _DIRECTIVE.findall(before):
            kind, _, rest = directive.partition(":")
            kind = kind.strip()
            if kind == "skip":
                if not rest.strip():
                    raise ValueError(f"{doc}:{line}: a docs-test skip needs a reason")
                block.skip = rest.strip()
            elif kind == "cpu-dependent":
                block.cpu_dependent = True
            elif kind == "quick":
                for pair in rest.split(";"):
                    old, sep, new = pair.partition("=>")
                    if not sep:
                        raise ValueError(f"{doc}:{line}: docs-test quick: expected OLD => NEW, got {pair!r}")
                    block.quick.append((old.strip(), new.strip()))
            else:
                raise ValueError(f"{doc}:{line}: unknown docs-test directive {directive!r}")
        if block.language == "text" and blocks and not before.strip():
            blocks[-1].expected = block.code
        elif block.language in ("python", "bash"):
            if block.language == "python":
                names = _SAVE_AS.findall(before.split("\n\n")[-1]) or _SAVE_AS.findall(before)
                block.filename = names[-1] if names else f"{Path(doc).stem}_line{line}.py"
            blocks.append(block)
        end = m.end()
    return blocks


def _code(block: Block) -> str:
    code = block.code.replace("/path/to/mooncake-gym", str(ROOT))
    if not FULL:
        for old, new in block.quick:
            if old not in code:
                raise AssertionError(f"{block.doc}:{block.line}: docs-test quick: {old!r} is not in the block")
            code = code.replace(old, new)
    return code


def _bash_script(code: str) -> str:
    lines = [ln for ln in code.splitlines() if not re.match(r"\s*(source|mkdir|cd)\s", ln)]
    return "set -e -o pipefail\n" + "\n".join(lines) + "\n"


def _compare(block: Block, done: subprocess.CompletedProcess) -> list[str]:
    """The differences between what the block printed and the text block after it."""
    if block.expected is None:
        return []
    got = [ln.rstrip() for ln in done.stdout.splitlines()]
    problems = []
    expected_out = []
    for ln in block.expected.splitlines():
        if ln.startswith("note:"):
            if ln.rstrip() not in done.stderr:
                problems.append(f"missing on stderr: {ln!r}")
        else:
            expected_out.append(ln.rstrip())
    if got != expected_out:
        import difflib

        diff = "\n".join(difflib.unified_diff(expected_out, got, "documented", "printed", lineterm="", n=0))
        problems.append(diff)
    return problems


def _run_doc(doc: str, tmp_path: Path) -> list[str]:
    env = {**os.environ, "MPLBACKEND": "Agg", "PYTHONHASHSEED": "0",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    blocks = parse(doc)
    run_later = {b.filename for b in blocks if b.language == "python"
                 for later in blocks if later.language == "bash" and f"python {b.filename}" in later.code}
    failures = []
    for block in blocks:
        where = f"{doc}:{block.line}"
        if block.skip:
            continue
        code = _code(block)
        if block.language == "python":
            (tmp_path / block.filename).write_text(code)
            if block.filename in run_later:
                continue
            command = [sys.executable, block.filename]
        else:
            command = ["bash", "-c", _bash_script(code)]
        start = time.perf_counter()
        done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1800)
        print(f"{where}: {time.perf_counter() - start:.1f} s")  # shown with pytest -s
        if done.returncode != 0:
            failures.append(f"{where}: exit {done.returncode}\n{done.stderr[-2000:]}")
            continue
        if FULL or not block.cpu_dependent:
            failures += [f"{where}: output differs{' (cpu-dependent)' if block.cpu_dependent else ''}:\n{p}"
                         for p in _compare(block, done)]
    return failures


@pytest.mark.parametrize("doc", DOCS)
def test_every_code_block_runs_and_prints_what_the_doc_shows(doc, tmp_path):
    failures = _run_doc(doc, tmp_path)
    assert not failures, "\n\n".join(failures)


@pytest.mark.parametrize("doc", DOCS)
def test_every_code_block_is_run_or_skipped_with_a_reason(doc):
    blocks = parse(doc)
    assert any(b.language == "python" for b in blocks)
    for b in blocks:
        assert b.skip is None or len(b.skip) > 10, f"{doc}:{b.line}: say why the block is not run"
    # file names of saved blocks are unique (a later block must not overwrite an earlier one's module)
    names = [b.filename for b in blocks if b.language == "python"]
    assert len(names) == len(set(names)), names


def test_tutorial_trainings_write_to_distinct_folders():
    text = (ROOT / "docs/tutorial.md").read_text()
    outs = re.findall(r"--out[ =]\s*(\S+)", text) + re.findall(r'out=f?"([^"]+)"', text)
    assert len(outs) >= 4 and len(outs) == len(set(outs)), outs


def test_parse_reads_directives_names_and_expected_output(tmp_path, monkeypatch):
    doc = tmp_path / "doc.md"
    doc.write_text("Save as `a.py`:\n\n```python\nprint(1)\n```\n\n```text\n1\n```\n\n"
                   "<!-- docs-test: skip: needs a downloaded trace file -->\n```bash\nmooncake-gym replay --trace x\n```\n\n"
                   "<!-- docs-test: cpu-dependent -->\n<!-- docs-test: quick: 50_000 => 64 -->\n"
                   "```python\nprint(50_000)\n```\n\n```\nlayout\n```\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    a, b, c = parse("doc.md")
    assert (a.filename, a.expected, a.skip) == ("a.py", "1\n", None)
    assert b.language == "bash" and b.skip == "needs a downloaded trace file"
    assert c.cpu_dependent and c.quick == [("50_000", "64")] and c.filename == "doc_line18.py"
    doc.write_text("<!-- docs-test: skip: -->\n```bash\nls\n```\n")
    with pytest.raises(ValueError, match="needs a reason"):
        parse("doc.md")
