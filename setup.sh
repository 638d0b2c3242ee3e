#!/usr/bin/env bash
# Install what embodied needs on a fresh Debian machine: OpenGL for headless MuJoCo
# rendering (EGL, with OSMesa as the fallback), Chromium and its driver (the labelling page's
# end-to-end test runs in a real headless browser), FFmpeg's libraries (torchcodec decodes the
# videos of LeRobotDatasets with them), the Python package with its test extras, and lerobot-dataset.
set -euo pipefail
cd "$(dirname "$0")"
need=()
for pkg in libegl1 libgl1 libosmesa6 chromium chromium-driver ffmpeg; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi
python3 -m pip install -q --disable-pip-version-check -e ".[dev]"
# LeRobotDataset v3 in and out: lerobot-dataset without its declared dependencies, whose huggingface-hub<0.36
# would take transformers, diffusers and sentence-transformers back a major version; pyproject.toml lists what it
# needs (datasets, av, torchcodec, numpy<2.4). pip's later notes that its declared requirements are unmet are expected
python3 -m pip install -q --disable-pip-version-check --no-deps "lerobot-dataset==0.4.4"
