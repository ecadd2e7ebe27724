"""After a release: synthetic records from a release with their signed manifest (`files`) and its check (`verify`).

May import: every stage up to and including the recipe.
"""
