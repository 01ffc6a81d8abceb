#!/usr/bin/env bash
# Installs Debian's etcd-server for the integration tests when it is missing (the package does not auto-start).
set -euo pipefail
if command -v etcd >/dev/null 2>&1; then
  exit 0
fi
SUDO=""
if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq etcd-server >/dev/null
command -v etcd >/dev/null
