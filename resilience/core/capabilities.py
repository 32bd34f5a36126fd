"""The optional capabilities a checkpoint strategy may offer, by name.

A strategy declares what it offers in ``CheckpointStrategy.capabilities`` (a wrapper: in
``capabilities_for(options)``, from its inner strategy's); a fault declares what it needs in
``Fault.requires``. The scenario validator compares the two once, at load, and refuses a scenario
whose strategy lacks what its fault needs. Each member's comment (below) names the method of
`resilience.strategies.base.CheckpointStrategy` that the capability stands for; a class that
declares one overrides that method, and a class that overrides it declares it (checked when the
class is created).
"""
from __future__ import annotations

from enum import Enum


class Capability(str, Enum):
    """One optional capability of a checkpoint strategy (its value: the base's member it offers)."""

    #: ``tag_for(step)``: the tag (directory name) the strategy passes its library for a step's save
    TAGS = "tag_for"
    #: ``in_flight_steps()``: the steps whose background saves have begun and not yet completed
    IN_FLIGHT_STEPS = "in_flight_steps"
    #: ``rewrite_version_stamp(step, claim)``: its checkpoints carry a version stamp it can restamp
    VERSION_STAMP = "rewrite_version_stamp"
    #: ``step_location(step)`` and ``load_step(workload, step)``: restore a chosen checkpoint
    CHOSEN_STEP = "load_step"
    #: ``during_memory_copy(callback)``: a save copies the state into memory that outlives the
    #: process (an in-memory tier), and the strategy can call back in the middle of that copy
    MEMORY_COPY = "during_memory_copy"
    #: ``restored_tier()``: a restore may come from one of several tiers (memory, storage), and the
    #: strategy says which one served each rank; the oracle requires every rank to agree
    RESTORE_TIERS = "restored_tier"

    @property
    def methods(self) -> tuple[str, ...]:
        """The methods of the base a strategy overrides to offer this capability."""
        return ("step_location", "load_step") if self is Capability.CHOSEN_STEP else (self.value,)

    @property
    def described(self) -> str:
        """``TAGS (tag_for())``: how an error message names it."""
        return f"{self.name} ({' and '.join(f'{method}()' for method in self.methods)})"

    def __str__(self) -> str:
        return self.value
