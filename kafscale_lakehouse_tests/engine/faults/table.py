"""The fault matrix's outcome as a table (actors by points by outcome), from a pytest JUnit XML report.

    KAFSCALE_FAULT_MATRIX=60 pytest kafscale_lakehouse_tests/engine/faults --junitxml=matrix.xml
    python -m kafscale_lakehouse_tests.engine.faults.table matrix.xml [more.xml ...]

One row per primary and point; per action, the cases that passed of those run, and the failed cases by secondary.
"""

from __future__ import annotations

import re
import sys
import xml.etree.ElementTree as ElementTree
from collections import defaultdict

from kafscale_lakehouse_tests.engine.faults.matrix import ACTIONS

CASE_ID = re.compile(r"\[(?P<primary>[\w-]+)@(?P<point>[\w-]+)/(?P<action>\w+)\+(?P<secondary>[\w:-]+)\]$")


def outcome_table(*junit_xmls: str) -> str:
    runs: dict[tuple[str, str], dict[str, list[tuple[str, bool]]]] = defaultdict(lambda: defaultdict(list))
    cases = [case for path in junit_xmls for case in ElementTree.parse(path).getroot().iter("testcase")]
    for case in cases:
        match = CASE_ID.search(case.get("name", ""))
        if match is None:
            continue
        failed = case.find("failure") is not None or case.find("error") is not None
        if case.find("skipped") is not None:
            continue
        runs[(match["primary"], match["point"])][match["action"]].append((match["secondary"], not failed))
    lines = ["| primary | point | " + " | ".join(ACTIONS) + " |", "|---|---|" + "---|" * len(ACTIONS)]
    for (primary, point), by_action in sorted(runs.items()):
        cells = []
        for action in ACTIONS:
            cases = by_action.get(action, [])
            if not cases:
                cells.append("")
                continue
            passed = sum(ok for _, ok in cases)
            failures = ", ".join(sorted(secondary for secondary, ok in cases if not ok))
            cells.append(f"{passed}/{len(cases)} ok" + (f" (failed: {failures})" if failures else "")
                         + f" [{', '.join(sorted(s for s, _ in cases))}]")
        lines.append(f"| {primary} | {point} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(outcome_table(*sys.argv[1:]))
