"""Choosing settings: the budget report (`budget`), clip guidance (`clipguide`) and charged sweeps (`sweep`).

May import: every stage up to and including the recipe.
"""
