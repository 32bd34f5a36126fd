"""The bottom layer: the records passed between layers (case, plan, results, verdict), topology,
device placement, the plug-in registry, the janitor, confined paths. Standard library and torch
types only."""
