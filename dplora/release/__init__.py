"""The release stage: the record (`record`), model card (`card`), keys (`keys`), the signed DSSE envelope and
Sigstore bundle (`envelope`), opening any signed statement (`statement`), what a derived artifact (synth, export) says
about its release (`derived`), `dplora verify` (`verify`) and reading a released run folder (`read`).

May import: the stages below it (contract, accounting, plan, data, engine, run) and `dplora.errors`.
"""
