"""The recipe stage: `dplora train` assembled from the stages below it (`train`: plan, data, engine, the run loop,
the release and the ledger charge), as torchtune keeps recipes apart from the components they assemble.

May import: every stage below it (contract … evaluate). Imported by audit, synth, tuning and cli only.
"""
