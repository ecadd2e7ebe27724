"""Empirical privacy audits: canaries, the one-run ε lower bound, exposure and membership inference."""
