#!/usr/bin/env bash
# Install the build and test dependencies on Debian 12 / Ubuntu 24.04 (idempotent).
#   usage: scripts/deps.sh [--no-pypi]   (--no-pypi: Debian packages only, for scripts/demo)
set -euo pipefail
PKGS=(build-essential meson ninja-build pkg-config clang
      libzmq3-dev libmsgpack-dev libuv1-dev libnuma-dev libjansson-dev libpcre2-dev libutf8proc-dev
      libinih-dev libsystemd-dev zlib1g-dev liburing-dev python3 python3-zmq python3-msgpack python3-numpy python3-jinja2 gnuplot-nox
      libmicrohttpd-dev python3-prometheus-client python3-pip util-linux iproute2
      wamerican curl)
missing=()
for p in "${PKGS[@]}"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
if [ ${#missing[@]} -gt 0 ]; then
    echo "deps: installing ${missing[*]}" >&2
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
# The HTTP tests drive strata-http with OpenAI's own Python SDK, which Debian does not package:
# from PyPI, for the system python3 the tests run under.
if [ "${1:-}" != --no-pypi ] && ! /usr/bin/python3 -c 'import openai' 2>/dev/null; then
    echo "deps: installing the openai Python package (PyPI)" >&2
    $SUDO /usr/bin/python3 -m pip install -q --break-system-packages openai >/dev/null
fi
