#!/usr/bin/env bash
# Installs duet's build and test dependencies from Debian's packages (idempotent; skips apt-get
# when everything is already installed).
set -euo pipefail
packages=(build-essential cmake pkg-config nlohmann-json3-dev libcli11-dev libpcre2-dev
          libcpp-httplib-dev libgtest-dev libbenchmark-dev python3 python3-numpy
          openmpi-bin libopenmpi-dev curl
          clang  # libFuzzer with AddressSanitizer and UBSan, for fuzz/
          iproute2)  # ip, tc: the cluster emulator (tools/cluster/); ss: the serve test
# node and npm run the tokenizer's reference tests (tests/npm/tokenizer).
command -v node > /dev/null || packages+=(nodejs npm)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi
