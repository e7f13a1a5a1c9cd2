"""The notebooks' Markdown as JupyterLab shows it: a `$` is text, never the start of math.

JupyterLab's Markdown (and MathJax over it) reads a pair of `$` as inline math: generate.ipynb's Conclusion
("… share of its target, $ and stop reason. The health figure is … failed, $ and the wait") showed as one italic
run of LaTeX (issue 53 item 16). Written `\\$`, it is a literal dollar. Inside a code span or a fenced block a `$`
is already text (MathJax skips `<code>` and `<pre>`), and a backslash there would show: `\\$` is wrong there.
`tests/notebooks/test_lab.py` checks the same in a browser: a `\\$` renders as `$` and no math element.
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


def prose_and_code(markdown: str) -> tuple[str, str]:
    """(text outside code, text of code spans and fenced blocks) of a Markdown cell; code replaced by spaces in the
    first so positions stay."""
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
        prose.append(" " * (len(line) - 1) + "\n")
    text = "".join(prose)
    code += [m.group(2) for m in CODE_SPAN.finditer(text)]
    return CODE_SPAN.sub(lambda m: " " * len(m.group(0)), text), "".join(code)


def unescaped_dollars(markdown: str) -> list[str]:
    """Each line of the cell's prose with a `$` that no backslash escapes (an even run of backslashes before it
    escapes only themselves)."""
    prose, _ = prose_and_code(markdown)
    return [line for line in prose.splitlines() if re.search(r"(?<!\\)(?:\\\\)*\$", line)]


def markdown_cells(path: Path) -> list[tuple[str, str]]:
    return [(c.get("id", str(i)), "".join(c["source"]))
            for i, c in enumerate(json.loads(path.read_text())["cells"]) if c["cell_type"] == "markdown"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_dollar_in_markdown_is_escaped(path):
    """No Markdown cell of any notebook has a `$` outside code that is not written `\\$`, nor a `\\$` in code."""
    found = {cell: lines for cell, source in markdown_cells(path) if (lines := unescaped_dollars(source))}
    assert not found, f"{path.name}: write each $ as \\$ (JupyterLab reads a pair of $ as math): {found}"
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
