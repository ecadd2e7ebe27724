"""The contract stage: the validated contract (`spec`: the frozen pydantic model and its bounds) and its loader
(`loader`: bounded YAML, command-line overrides, one-line validation errors).

May import: `dplora.errors`, `dplora.accounting`. No torch.
"""
