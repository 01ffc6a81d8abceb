#!/usr/bin/env bash
# Coverage-guided fuzzing of the columnar Avro decoder (kafscale_lakehouse/value_formats/_avro_columns.c) with atheris.
#
# Builds the extension with clang under AddressSanitizer and UBSan plus libFuzzer's coverage instrumentation
# (-fsanitize=address,undefined,fuzzer-no-link) into its own directory, $FUZZ_BUILD (the installed extension is left
# alone), then runs kafscale_lakehouse_tests/fuzz/avro_fuzz.py with atheris's ASan+libFuzzer runtime preloaded, as
# atheris documents for native extensions. The harness loads the sanitized build in place of the installed one.
#
# Inputs: the seed corpus kafscale_lakehouse_tests/fuzz/corpus/avro (read, never written), its seeds cut at every
# byte ($FUZZ_BUILD/cuts, written each run) and the working corpus $FUZZ_BUILD/corpus (new inputs go there). A finding
# (crash, sanitizer report, unexpected exception, timeout) is written under $FUZZ_BUILD/artifacts/ and the script
# exits non-zero.
#
# Environment: PYTHON (an interpreter with the project and atheris installed; default .venv/bin/python), CC (clang),
# FUZZ_SECONDS (default 60), FUZZ_BUILD (default build/fuzz-avro), FUZZ_ARGS (more libFuzzer flags, e.g. -runs=N or
# -seed=N), AVRO_FUZZ_INSTRUMENT (comma-separated modules whose Python code atheris instruments too; default none).
# Arguments: input files to run once instead of fuzzing (an artifact's replay), e.g.
#   scripts/fuzz-avro.sh build/fuzz-avro/artifacts/crash-...
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
CC="${CC:-clang}"
FUZZ_SECONDS="${FUZZ_SECONDS:-60}"
FUZZ_BUILD="${FUZZ_BUILD:-$ROOT/build/fuzz-avro}"
SEEDS="$ROOT/kafscale_lakehouse_tests/fuzz/corpus/avro"

command -v "$CC" >/dev/null || { echo "fuzz-avro: $CC not found (scripts/install-clang.sh installs it)" >&2; exit 2; }
ATHERIS_DIR="$("$PYTHON" -c 'import atheris; print(atheris.path())')"
PRELOAD="$ATHERIS_DIR/asan_with_fuzzer.so"
[ -f "$PRELOAD" ] || { echo "fuzz-avro: $PRELOAD missing (atheris installed without its sanitizer runtimes)" >&2; exit 2; }

INCLUDE="$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')"
SUFFIX="$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')"
mkdir -p "$FUZZ_BUILD/corpus" "$FUZZ_BUILD/artifacts"
EXTENSION="$FUZZ_BUILD/_avro_columns$SUFFIX"
# The decoder's own buffers from malloc itself (PyMem_* would serve small ones from pymalloc's pools, where ASan
# sees no bounds): a translation unit that includes the decoder with PyMem_* mapped to the C allocator.
cat > "$FUZZ_BUILD/avro_columns_malloc.c" <<C
#include <Python.h>
#include <stdlib.h>
#define PyMem_Calloc calloc
#define PyMem_Realloc realloc
#define PyMem_Free free
#include "$ROOT/kafscale_lakehouse/value_formats/_avro_columns.c"
C
# -fno-sanitize-recover: a UBSan report (signed overflow, misaligned load, bad shift) aborts like an ASan one.
"$CC" -shared -fPIC -g -O1 -fno-omit-frame-pointer \
  -fsanitize=address,undefined,fuzzer-no-link -fno-sanitize-recover=all \
  -I"$INCLUDE" "$FUZZ_BUILD/avro_columns_malloc.c" -o "$EXTENSION"

if [ "$#" -gt 0 ]; then
  INPUTS=("$@")
else
  # The seeds cut at every byte (fuzz/avro_inputs.py), generated for each run; the seeds; then new inputs.
  PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -m kafscale_lakehouse_tests.fuzz.avro_inputs "$FUZZ_BUILD/cuts"
  INPUTS=("$FUZZ_BUILD/corpus" "$SEEDS" "$FUZZ_BUILD/cuts")
fi

# Python's objects stay in pymalloc (PYTHONMALLOC=malloc would put every one through ASan's allocator: 3x slower);
# the values' bytes are a malloc'd copy of their exact size (fuzz/avro_inputs.py). Python's own allocations are never
# freed at exit, hence no leak detection.
export LD_PRELOAD="$PRELOAD"
export ASAN_OPTIONS="detect_leaks=0:allocator_may_return_null=1:abort_on_error=0${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
export AVRO_FUZZ_EXTENSION="$EXTENSION"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
# -timeout: one input that keeps the decoder busy for 10 s is a finding (a few KB must not take that long).
# shellcheck disable=SC2086
exec "$PYTHON" "$ROOT/kafscale_lakehouse_tests/fuzz/avro_fuzz.py" \
  -max_total_time="$FUZZ_SECONDS" -timeout=10 -rss_limit_mb=3072 -max_len=4096 \
  -dict="$ROOT/kafscale_lakehouse_tests/fuzz/avro.dict" -artifact_prefix="$FUZZ_BUILD/artifacts/" -print_final_stats=1 \
  ${FUZZ_ARGS:-} "${INPUTS[@]}"
