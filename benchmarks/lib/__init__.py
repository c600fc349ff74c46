"""What the benchmark programs share: prompts (prompts.py), the one registry of configurations
and engines with the equal-sampler switch (engines.py), the model pairs and their command-line
arguments (models.py), the runner that warms up, interleaves and repeats (runner.py), the
resumable record store (store.py), records, tables and plots (report.py), statistics
(stats.py), HumanEval's harness (humaneval.py), a server in a subprocess (server.py), device
timing (graphs.py), model shapes and a plain PyTorch decoder (shapes.py, decoder.py) and the
step-cost model of the projections (projection.py). No program imports another; every program
imports, of this project, only from here and the package: what a program needs of devtools
(engine builders, model pairs, the server, the console) a module here names
(tests/test_benchmarks_shape.py holds it)."""
