"""Helpers shared by a test module and its slow tier under tests/slow/ (one module per test module)."""
