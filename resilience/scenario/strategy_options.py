"""Strategy options given on a command line (`--option KEY=VALUE`), as a scenario would give them."""
from __future__ import annotations

import yaml

from ..errors import ResilienceError


def parse_options(pairs: list[str]) -> dict:
    """``--option KEY=VALUE`` pairs as strategy options, each VALUE read as YAML (``true``, ``2``)."""
    options = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ResilienceError(f"--option {pair!r}: expected KEY=VALUE, e.g. --option stagger=2")
        options[key] = yaml.safe_load(value)
    return options
