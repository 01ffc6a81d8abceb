"""Lists written as GitHub renders them, rendered the same by mkdocs.

The pages are written for GitHub too (README.md links into them), where a list may follow a paragraph line directly
and a list item's nested blocks (a code fence, an image, a nested list) are indented by 2 spaces. Python-Markdown
needs a blank line before a list and 4 spaces per nesting level. This hook (mkdocs.yml `hooks:`) rewrites each page's
markdown before it is rendered: a blank line before a list that follows other text, and every line inside a list
item shifted right by 2 spaces per level of nesting. Code fences outside lists are left as they are.
"""

from __future__ import annotations

import re
from typing import Any

LIST_ITEM = re.compile(r"^(\s*)([-*+]|\d+[.)])(\s+)")
FENCE = re.compile(r"^\s*(```|~~~)")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def gfm_lists(markdown: str) -> str:
    out: list[str] = []
    content_indents: list[int] = []  # per open list item: where its content starts, as written
    fence: str | None = None  # the fence a code block was opened with
    fence_shift = 0
    previous_blank = True
    for line in markdown.split("\n"):
        if fence is not None:  # inside a code block: shifted as its opening line was
            out.append(" " * fence_shift + line if line.strip() else line)
            if line.strip().startswith(fence):
                fence = None
            continue
        if not line.strip():
            out.append(line)
            previous_blank = True
            continue
        indent = _indent(line)
        item = LIST_ITEM.match(line)
        in_list = bool(content_indents)
        while content_indents and (indent < content_indents[-1] if item is None and previous_blank
                                   else item is not None and indent < content_indents[-1]):
            content_indents.pop()
        if item is not None:
            if not in_list and not previous_blank:
                out.append("")  # a list right after a paragraph line
            shift = 2 * len(content_indents)
            content_indents.append(indent + len(item.group(2)) + len(item.group(3)))
        else:
            shift = 2 * len(content_indents)
        fence_match = FENCE.match(line)
        if fence_match is not None:
            fence, fence_shift = fence_match.group(1), shift
        out.append(" " * shift + line)
        previous_blank = False
    return "\n".join(out)


def on_page_markdown(markdown: str, **_: Any) -> str:  # mkdocs hook
    return gfm_lists(markdown)
