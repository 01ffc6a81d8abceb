#!/usr/bin/env bash
# Installs Debian's clang and its compiler-rt runtimes (AddressSanitizer, UBSan, libFuzzer) when missing: the fuzz
# run (scripts/fuzz-avro.sh) builds the Avro decoder extension with -fsanitize=address,undefined,fuzzer-no-link.
set -euo pipefail
# -print-file-name echoes the bare name when clang has no such runtime.
if command -v clang >/dev/null 2>&1 && [ -f "$(clang -print-file-name=libclang_rt.asan-x86_64.a)" ]; then
  exit 0
fi
SUDO=""
if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq clang libclang-rt-dev >/dev/null
command -v clang >/dev/null
