"""Coverage-guided fuzzing of the columnar Avro decoder for a short budget (scripts/fuzz-avro.sh: the extension built
with AddressSanitizer and UBSan, atheris driving fuzz/avro_fuzz.py from the seed corpus fuzz/corpus/avro).

The run replays every corpus input first (the generated seeds, the `finding-*` inputs that exposed bugs, and the seeds
cut at every byte), then mutates them for AVRO_FUZZ_SECONDS (default 60). Any finding fails the test with the fuzzer's
report and the path of the input that caused it (replay it with `scripts/fuzz-avro.sh PATH`); add it to the corpus as
`finding-NAME` once fixed. Needs clang (scripts/install-clang.sh) and atheris (the test extras): `make install-test`
installs both.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]


@pytest.mark.fuzz
def test_the_avro_decoder_survives_a_fuzz_run(tmp_path: Path) -> None:
    seconds = int(os.environ.get("AVRO_FUZZ_SECONDS", "60"))
    env = {**os.environ, "PYTHON": sys.executable, "FUZZ_SECONDS": str(seconds), "FUZZ_BUILD": str(tmp_path)}
    run = subprocess.run([str(ROOT / "scripts" / "fuzz-avro.sh")], env=env, capture_output=True, text=True,
                         timeout=seconds + 240, check=False)
    artifacts = sorted(p.name for p in (tmp_path / "artifacts").iterdir()) if (tmp_path / "artifacts").is_dir() else []
    report = "\n".join((run.stdout + run.stderr).splitlines()[-80:])
    assert run.returncode == 0 and not artifacts, (
        f"fuzz run exited {run.returncode}, findings {artifacts} in {tmp_path / 'artifacts'}:\n{report}")
    assert "DONE" in run.stderr, f"the fuzz run did not run to its budget:\n{report}"
