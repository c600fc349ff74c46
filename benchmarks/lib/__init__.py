"""What the benchmark programs share: prompts (prompts.py), engine configurations and the
equal-sampler switch (engines.py), the runner that warms up, interleaves and repeats
(runner.py), records, tables and plots (report.py), statistics (stats.py) and HumanEval's
harness (humaneval.py). No program imports another; every program imports from here."""
