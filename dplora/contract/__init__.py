"""The contract stage: the validated YAML contract (`spec`: pydantic model, loader, overrides, hashes).

May import: `dplora.errors`, `dplora.accounting`. No torch.
"""
