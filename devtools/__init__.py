"""Development code that the package does not ship: tiny random models of each family (the tests, the benchmarks'
smoke runs) and the llama-server build (``make llama-server``, the remote-model tests and benchmark).

Importable from the repository root: pytest puts it on the path (``pythonpath`` in pyproject.toml), ``python -m``
run there does, and the benchmarks do it through ``benchmarks/repo_root.py``. Nothing in ``playground/`` imports it
(an import-linter contract says so).
"""
