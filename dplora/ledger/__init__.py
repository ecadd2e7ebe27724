"""The ledger stage: the privacy ledger's store and composition (`store`), settling killed runs and intermediate
releases from their checkpoints (`recovery`).

May import: the stages below it (contract … run, release) and `dplora.errors`.
"""
