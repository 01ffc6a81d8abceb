#!/usr/bin/env bash
# Builds KafScale's broker, at the version tools/kafscale/go.mod pins, into .tools/bin/ for the real-broker tests
# (kafscale_lakehouse_tests/real_broker). Once per version: an existing binary of that version is kept. Go's module
# and build caches are reused, and the module hashes come from tools/kafscale/go.sum (the proxy does not serve
# v1.6.0, and sum.golang.org does not know v1.5.0; see docs/real-broker.md).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
MODULE_DIR="$ROOT/tools/kafscale"
BIN_DIR="${KAFSCALE_TOOLS_BIN:-$ROOT/.tools/bin}"
if ! command -v go >/dev/null 2>&1; then
  echo "install-kafscale: Go >= 1.25 is needed to build KafScale's broker for the tests (https://go.dev/dl/)" >&2
  exit 1
fi
cd "$MODULE_DIR"
VERSION="$(GOFLAGS=-mod=readonly go list -m -f '{{.Version}}' github.com/KafScale/platform)"
TARGET="$BIN_DIR/kafscale-broker-$VERSION"
if [ -x "$TARGET" ]; then
  exit 0
fi
mkdir -p "$BIN_DIR"
# -mod=readonly: go.mod and go.sum are used as committed, every downloaded module is checked against go.sum.
GOFLAGS=-mod=readonly go build -trimpath -o "$TARGET.tmp" github.com/KafScale/platform/cmd/broker
mv "$TARGET.tmp" "$TARGET"
echo "install-kafscale: built $TARGET"
