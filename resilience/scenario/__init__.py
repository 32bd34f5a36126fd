"""Scenario files -> cases: safe YAML, validation, matrix expansion, discovery and selection."""
