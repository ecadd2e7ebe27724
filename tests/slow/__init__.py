"""The slow tier: CLI training runs, multi-process runs, the 135M model and long checks.

tests/conftest.py marks every test under this folder slow."""
