#!/usr/bin/env bash
# Install the build and test dependencies on Debian 12 / Ubuntu 24.04 (idempotent).
set -euo pipefail
PKGS=(build-essential meson ninja-build pkg-config clang
      libzmq3-dev libmsgpack-dev libuv1-dev libnuma-dev libjansson-dev libpcre2-dev libutf8proc-dev
      libinih-dev libsystemd-dev zlib1g-dev python3 python3-zmq python3-msgpack python3-numpy gnuplot-nox
      wamerican)
missing=()
for p in "${PKGS[@]}"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then exit 0; fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "deps: installing ${missing[*]}" >&2
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
