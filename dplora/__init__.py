"""dplora: differentially private LoRA fine-tuning from a declared privacy contract.

Data flows one way: contract → plan (q, T, σ; no model) → data (units, sampling, tokens) →
engine (model, LoRA, clip, noise, accountant, stop) → release (record, hashes, signature) → audit.
"""

__version__ = "0.1.0"
