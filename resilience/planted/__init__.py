"""Planted bugs: deliberately broken checkpoint strategies, each modelled on a real failure mode,
the cases that catch them, and `resilience planted`, which measures caught / planted.

``strategies`` holds the broken strategies and the correct twins their catching cases are checked
against; ``catalogue`` says which case catches which bug; ``command`` runs them."""
