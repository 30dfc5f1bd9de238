#!/usr/bin/env bash
# Install everything the test suite needs on Debian/Ubuntu, then run all of it:
# import contracts (lint-imports), lint (ruff), tests (pytest). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=$( [ "$(id -u)" = 0 ] || echo sudo )

# Xvfb gives pytest-xvfb a virtual X display; the rest are what Qt's xcb platform plugin and
# pyqtgraph's OpenGL view load (without libxcb-cursor0 the xcb plugin refuses to start).
SYSTEM_PACKAGES=(
    xvfb xauth
    libxcb-cursor0 libxkbcommon-x11-0 libxcb-icccm4 libxcb-keysyms1 libxcb-image0
    libxcb-render-util0 libxcb-xinerama0 libxcb-shape0 libxcb-randr0 libxcb-xkb1
    libgl1-mesa-dri libegl1 libgl1 libglib2.0-0 libfontconfig1 libdbus-1-3
)

# Always the project's own virtual environment: installing editable into whatever python3 is on
# PATH (pyenv, conda, the system's) would replace a `loomlab` someone installed there. Debian's
# and Ubuntu's python3 can make one only with python3-venv (it brings ensurepip); a pyenv or
# conda python3 can by itself, and must not pull in the distribution's Python.
PYTHON=.venv/bin/python
if [ ! -x "$PYTHON" ] && ! python3 -c 'import ensurepip, venv' 2>/dev/null; then
    SYSTEM_PACKAGES+=(python3-venv)
fi

if command -v dpkg-query >/dev/null; then
    missing=()
    for pkg in "${SYSTEM_PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
    done
    # Skipping apt when nothing is missing keeps repeated runs fast and off the network.
    if [ ${#missing[@]} -gt 0 ]; then
        $SUDO apt-get update
        $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
    fi
else
    echo "not a Debian/Ubuntu system: install the equivalents of: ${SYSTEM_PACKAGES[*]}" >&2
fi

if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
"$PYTHON" -m pip install -e '.[dev,cluster,control]'

# lint-imports and ruff are console scripts of the interpreter we just installed into.
PATH="$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_path("scripts"))'):$PATH"
lint-imports --no-cache
ruff check .
"$PYTHON" -m pytest "$@"
