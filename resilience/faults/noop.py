"""The no-op fault: the first run goes undisturbed (a baseline, and a check of the strategy's restore)."""
from __future__ import annotations

from .base import Fault


class NoFault(Fault):
    """Nothing goes wrong; the restart still restores from the newest checkpoint and is verified."""

    kind = "none"
    leaves_saves_alone = True
    in_timelines = True
    needs_trigger = False
    on_objects = True
