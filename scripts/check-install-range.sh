#!/usr/bin/env bash
# Installs kafscale-lakehouse (default extras) at the lowest and at the highest end of the ranges in pyproject.toml,
# each in a fresh virtual environment under a temporary directory, and in each loads the Dagster definitions of the
# embedded example config and prints the versions resolved and the size of site-packages.
#   scripts/check-install-range.sh [EXTRAS]     e.g. scripts/check-install-range.sh k8s,glue
# Lowest: uv's `--resolution lowest-direct` (every direct dependency at the bottom of its range); highest: the
# newest releases the ranges allow. Needs python3.11+ and network access to PyPI; uv is installed into the
# temporary directory.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
extras="${1:-}"
target="$repo"
if [[ -n "$extras" ]]; then target="$repo[$extras]"; fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
python3 -m venv "$work/tools"
"$work/tools/bin/pip" install -q uv
uv="$work/tools/bin/uv"
status=0
for end in lowest highest; do
    venv="$work/$end"
    "$uv" venv -q --python "$(command -v python3)" "$venv"
    resolution=()
    if [[ "$end" == lowest ]]; then resolution=(--resolution lowest-direct); fi
    echo "== $end end of the ranges"
    if ! "$uv" pip install -q --python "$venv/bin/python" "${resolution[@]}" "$target"; then
        echo "FAILED: $end end does not install"; status=1; continue
    fi
    "$uv" pip list --python "$venv/bin/python" 2>/dev/null \
        | grep -E '^(dagster|pyspark|pyiceberg|pydantic|pandas|numpy|pyarrow|obstore|protobuf|grpcio) ' || true
    # The wheel holds the product package and its example configs, not the test suite.
    site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    if [[ -e "$site/kafscale_lakehouse_tests" ]]; then echo "FAILED: the test suite is installed"; status=1; fi
    # Load the definitions of the installed embedded example (no servers) outside the repository.
    mkdir -p "$work/$end-project/var/segments"
    cp "$site/kafscale_lakehouse/examples/embedded.yaml" "$work/$end-project/lakehouse.yaml"
    if (cd "$work/$end-project" && "$venv/bin/python" -W error::DeprecationWarning:kafscale_lakehouse - <<'PY'
import logging
import warnings

import dagster as dg

from kafscale_lakehouse.config import load_config
from kafscale_lakehouse.orchestration.component import build_definitions

warnings.simplefilter("error", dg.PreviewWarning)
definitions = build_definitions(load_config("lakehouse.yaml"))
keys = sorted(key.to_user_string() for key in definitions.resolve_asset_graph().get_all_asset_keys())
jobs = sorted(job.name for job in definitions.resolve_all_job_defs())
logging.basicConfig(level=logging.INFO, format="%(message)s")
logging.info("definitions load: %d assets (%s), %d jobs", len(keys), ", ".join(keys), len(jobs))
PY
    ); then
        echo "OK: $end end loads the definitions; site-packages $(du -sh "$venv"/lib/python3*/site-packages | cut -f1)"
    else
        echo "FAILED: $end end does not load the definitions"; status=1
    fi
done
exit $status
