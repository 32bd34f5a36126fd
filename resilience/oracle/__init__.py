"""Events -> verdict -> outcome: one set of rules for the harness, torchrun and black-box mode."""
