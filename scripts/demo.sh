#!/usr/bin/env bash
# The main job: set up .venv, then run the MTAD demo. Arguments go to `python -m devtools.demo`.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/setup_env.sh"
cd "$ROOT"
exec python -m devtools.demo "$@"
