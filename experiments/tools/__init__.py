"""The project's tools, kept out of the installed wheel and imported by nothing in the library.

  bench/      benchmarks and checks, each `python -m experiments.tools.bench.<name>`
  reproduce/  the reproduction queue (`python -m experiments.tools.reproduce list|run|...`),
              its claim family and the run records it writes under experiments/results/records
  report/     RESULTS.md from those records (`python -m experiments.tools.report --write=...`),
              the paired statistics and the tables
  docs.py     docs/commands.md from every command's `--help` (`python -m experiments.tools.docs`)

They run from a checkout (`pip install -e .`): a wheel carries only the library, its CLI and
the configs. tests/test_imports.py checks that nothing outside the tools and tests imports
them (DESIGN.md §6).
"""
