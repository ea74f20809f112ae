#!/usr/bin/env bash
# Installs everything mirage-onnx needs to build and test, idempotently:
# Debian packages with apt-get and a Python virtual environment in .venv with
# the pinned packages of scripts/requirements.txt. Safe to run again; it only
# does work when something is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

debs=(
  build-essential cmake pkg-config
  protobuf-c-compiler libprotobuf-c-dev   # the ONNX bindings are generated with protoc-c
  libonnx-dev                             # ships onnx.proto
  libonnx-testdata                        # ONNX's backend test models: the corpus tests
  libz3-dev                               # the search's subexpression checks
  libcmocka-dev                           # unit tests
  clang libclang-rt-14-dev                # libFuzzer harness
  python3-venv
  locales                                 # ONNX Runtime's StringNormalizer needs en_US.UTF-8
)

missing=()
for p in "${debs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing Debian packages: ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if ! locale -a 2>/dev/null | grep -qi '^en_US\.utf-\?8$'; then
  echo "setup: generating the en_US.UTF-8 locale"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO sed -i 's/^# *\(en_US.UTF-8 UTF-8\)/\1/' /etc/locale.gen
  $SUDO locale-gen >/dev/null
fi

# The virtual environment is rebuilt when the pinned requirements change.
stamp=".venv/.requirements.sha256"
want=$(sha256sum scripts/requirements.txt | cut -d' ' -f1)
if [ ! -x .venv/bin/python ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "setup: creating the Python environment in .venv"
  python3 -m venv .venv
  .venv/bin/python -m pip install -q --disable-pip-version-check -r scripts/requirements.txt
  echo "$want" > "$stamp"
fi
