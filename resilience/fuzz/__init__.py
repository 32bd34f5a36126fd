"""Property-based topology fuzzing: restore models and the Hypothesis search over them."""
