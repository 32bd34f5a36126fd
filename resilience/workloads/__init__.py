"""Deterministic training jobs the ranks train (plug-ins). See `base.Workload` for the contract."""
