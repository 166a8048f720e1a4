"""Test support code that the package does not ship: tiny random models of each family (the tests, the
benchmarks' smoke runs) and the llama-server build (``make llama-server``, the remote-model tests and benchmark).

Importable as ``support`` with ``tests/`` on the path: pytest puts it there (``pythonpath`` in pyproject.toml),
``make llama-server`` runs with ``PYTHONPATH=tests``, and the benchmarks do it through ``benchmarks/support_path.py``.
Nothing in ``playground/`` imports it (an import-linter contract says so).
"""
