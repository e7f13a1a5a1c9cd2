"""The notebooks' Markdown as JupyterLab shows it: a `$` is text, never the start of math.

JupyterLab's Markdown (and MathJax over it) reads a pair of `$` as inline math: generate.ipynb's Conclusion
("… share of its target, $ and stop reason. The health figure is … failed, $ and the wait") showed as one italic
run of LaTeX (issue 53 item 16). Written `\\$`, Lab's Markdown step leaves it alone, but it still hands MathJax a
plain `$` (marked drops the backslash), and MathJax typesets two of them that share one run of text, escaped or not
(JupyterLab 4.6, seen in a browser: `tests/notebooks/test_lab.py`). A code span, or any other element, between
them ends the run. So every `$` of a cell's prose is written `\\$`, and no two share a run: one per paragraph, or
a code span between them. Inside a code span or a fenced block a `$` is already text (MathJax skips `<code>` and
`<pre>`), and a backslash there would show.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from eagledata.notebooks import NOTEBOOK_DIR

NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
CODE_SPAN = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", re.DOTALL)


def prose_and_code(markdown: str, code_as: str = " ") -> tuple[str, str]:
    """(text outside code, text of code spans and fenced blocks) of a Markdown cell; in the first each character of
    code is replaced by `code_as`, so positions stay."""
    prose, code, fence = [], [], None
    for line in markdown.splitlines(keepends=True):
        m = FENCE.match(line)
        if fence is None and m:
            fence = m.group(1)
        elif fence is not None and m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence):
            fence = None
        elif fence is not None:
            code.append(line)
        else:
            prose.append(line)
            continue
        prose.append(code_as * (len(line) - 1) + "\n")
    text = "".join(prose)
    code += [m.group(2) for m in CODE_SPAN.finditer(text)]
    return CODE_SPAN.sub(lambda m: code_as * len(m.group(0)), text), "\n".join(code)


def unescaped_dollars(markdown: str) -> list[str]:
    """Each line of the cell's prose with a `$` that no backslash escapes (an even run of backslashes before it
    escapes only themselves)."""
    prose, _ = prose_and_code(markdown)
    return [line for line in prose.splitlines() if re.search(r"(?<!\\)(?:\\\\)*\$", line)]


BLOCK_START = re.compile(r"^ {0,3}(#{1,6} |[-*+] |\d+[.)] |>)")  # a heading, a list item, a quote: a new block
HEADING = re.compile(r"^ {0,3}#{1,6} ")  # one line: the next starts a block too
ELEMENT = "\0"  # where Markdown puts an element (a code span, an HTML tag): it ends MathJax's run of text


def dollar_runs(markdown: str) -> list[str]:
    """Runs of the cell's prose that hold two `$` or more, escaped or not: JupyterLab typesets them as math. A run
    ends at a blank line, a new block or an element (code span, HTML tag); a line break inside a paragraph does not
    end it, nor does emphasis or a link here (stricter than Lab: move or split the dollar)."""
    prose, _ = prose_and_code(markdown, ELEMENT)
    prose = re.sub(r"<[^<>\n]+>", lambda m: ELEMENT * len(m.group(0)), prose)
    blocks, block = [], []
    for line in prose.splitlines():
        if not line.strip() or BLOCK_START.match(line) or block and HEADING.match(block[0]):
            blocks.append(" ".join(block))
            block = []
        block.append(line)
    blocks.append(" ".join(block))
    return [run.strip() for b in blocks for run in b.split(ELEMENT) if run.count("$") >= 2]


def markdown_cells(path: Path) -> list[tuple[str, str]]:
    return [(c.get("id", str(i)), "".join(c["source"]))
            for i, c in enumerate(json.loads(path.read_text())["cells"]) if c["cell_type"] == "markdown"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_dollar_in_markdown_is_escaped(path):
    """No Markdown cell of any notebook has a `$` outside code that is not written `\\$`, two in one run of text, or
    a `\\$` in code."""
    found = {cell: lines for cell, source in markdown_cells(path) if (lines := unescaped_dollars(source))}
    assert not found, f"{path.name}: write each $ as \\$ (JupyterLab reads a pair of $ as math): {found}"
    runs = {cell: shared for cell, source in markdown_cells(path) if (shared := dollar_runs(source))}
    assert not runs, f"{path.name}: two $ in one run of text are math in JupyterLab even when escaped: {runs}"
    in_code = {cell: code for cell, source in markdown_cells(path) if "\\$" in (code := prose_and_code(source)[1])}
    assert not in_code, f"{path.name}: a backslash before $ shows in code: {in_code}"


def test_the_scan_finds_what_lab_would_typeset():
    """The rule on planted text: a bare `$` (also after an escaped backslash) is found; `\\$`, code spans of any
    fence length and fenced blocks are not; a `\\$` inside code is reported as code."""
    assert unescaped_dollars("costs $ and $ more") == ["costs $ and $ more"]
    assert unescaped_dollars("one $") == ["one $"]
    assert unescaped_dollars("a literal backslash \\\\$ then math") == ["a literal backslash \\\\$ then math"]
    assert unescaped_dollars("costs \\$ and \\$ more") == []
    assert unescaped_dollars("`$HOME` and ``a ` $b``") == []
    assert unescaped_dollars("text\n```bash\necho $HOME\n```\nafter \\$") == []
    assert unescaped_dollars("text\n```\n$ open fence\n") == []  # an unclosed fence runs to the end
    assert unescaped_dollars("line 1\nline 2 costs $\n`x`") == ["line 2 costs $"]
    assert prose_and_code("see `\\$x`")[1] == "\\$x"


def test_the_scan_finds_two_dollars_in_one_run():
    """Two `$` in one paragraph with only text between them are one run (Lab typesets them, escaped or not); a code
    span or an HTML tag between them, a blank line, a new list item or heading splits the run."""
    assert dollar_runs("costs \\$ and \\$ more") == ["costs \\$ and \\$ more"]
    assert dollar_runs("costs \\$ and\nthen \\$ more") == ["costs \\$ and then \\$ more"]
    assert dollar_runs("costs \\$ and `x` then \\$ more") == []
    assert dollar_runs("costs \\$ and <b>x</b> then \\$ more") == []
    assert dollar_runs("costs \\$\n\nthen \\$ more") == []
    assert dollar_runs("- costs \\$\n- then \\$ more") == []
    assert dollar_runs("## costs \\$\nthen \\$ more") == []
    assert dollar_runs("one \\$ only `$x` `$y`") == []
