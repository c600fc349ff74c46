#!/usr/bin/env bash
# The verdict for this machine: the target alone, vLLM's speculative decoding and MTAD at batch 1
# and 16, T=1 (top-k 10, top-p 0.9) and T=0 (MTAD "joint" and "exact"), on equal samplers,
# decoding timed apart (the real pair, fetched on first use; 14 minutes on a 2-core EPYC with
# AVX-512 BF16: benchmarks/reports/speed-cpu). Sets up .venv first.
# Arguments go to `python -m benchmarks.speed`: `--target DIR --draft DIR` for your own pair,
# `--tiny` for a tiny random pair (a minute), `--help` for the rest. Results in
# benchmarks/results/speed/ (JSON, Markdown, a plot).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/setup_env.sh"
cd "$ROOT"
exec python -m benchmarks.speed "$@"
