"""After a release: empirical privacy audits: canaries, the one-run ε lower bound, exposure and membership inference.

May import: every stage up to and including the recipe (`runner` trains through `dplora.recipe.train`).
"""
