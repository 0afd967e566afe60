"""Galvatron-BMW (../shared/papers/galvatron-bmw.md): search space, dynamic program, the search and
batch search, and the planners (Galvatron's variants and the paper's comparison points)."""
