"""The docs site's list hook (docs/hooks/gfm_lists.py): lists written as GitHub renders them reach Python-Markdown
with a blank line before them and their nested blocks indented as it needs; code fences outside lists stay as they
are."""

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("gfm_lists", ROOT / "docs" / "hooks" / "gfm_lists.py")
assert _spec is not None and _spec.loader is not None
gfm_lists = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = gfm_lists
_spec.loader.exec_module(gfm_lists)

GITHUB_STYLE = """By default:
- **The run** commits
  to the branch.
  ```bash
  kafscale-lakehouse audit show --table t   # what the branch holds
  ```
  - a nested item
    continued
- **A crash** leaves the branch

```yaml
mappings:
  - topic: orders
```
"""

PYTHON_MARKDOWN_STYLE = """By default:

- **The run** commits
    to the branch.
    ```bash
    kafscale-lakehouse audit show --table t   # what the branch holds
    ```
    - a nested item
        continued
- **A crash** leaves the branch

```yaml
mappings:
  - topic: orders
```
"""


def test_lists_get_a_blank_line_and_nested_blocks_four_spaces() -> None:
    assert gfm_lists.gfm_lists(GITHUB_STYLE) == PYTHON_MARKDOWN_STYLE


def test_a_page_without_lists_is_unchanged() -> None:
    page = "# Title\n\nA paragraph.\n\n```yaml\n- topic: orders\n  table: a.b\n```\n"
    assert gfm_lists.gfm_lists(page) == page
