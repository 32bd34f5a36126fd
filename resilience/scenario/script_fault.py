"""The fault of a case on a user's own script (black-box mode), checked by the scenario validator's
own fault rules (`validate.check_fault`) against what is known of a script before it runs.

A script offers nothing through the framework's API, so only faults that need nothing from it
are available (`script_faults`): no declared capability, no strategy to attach to, no harness
side that reads the case's workload or supervises the ranks, no crash-state exploration.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..core import registry
from ..core.case import FaultSpec
from ..faults.roles import HarnessSide, RankSide
from .checks import Problems, Validator
from .validate import check_fault

#: harness-side hooks a script's fault may have: each gets a `CaseEnvironment` without a case
SCRIPT_HARNESS_HOOKS = ("setup", "heal", "findings", "notes", "teardown")
#: faults whose harness side sizes itself from the case's workload, or supervises its ranks
_NEEDS_THE_CASE = ("stall", "partition", "throttle", "node_loss", "s3")


@dataclass(frozen=True)
class ScriptBounds:
    """What a trigger on a script is checked against: its world size. Its steps and the steps it
    saves at are known only once it ran: any step from 1 may be named (a fault whose step the
    script never reaches says so: ``fault_missed``, or no ``fault_fired``)."""

    world_size: int
    steps: int = 1_000_000

    @property
    def checkpoint_steps(self) -> range:
        return range(1, self.steps + 1)


def script_faults() -> tuple[str, ...]:
    """The registered faults a script can be put under, in registry order."""
    return tuple(name for name in registry.FAULTS if _usable_on_scripts(registry.resolve("fault", name)))


def _usable_on_scripts(cls: type) -> bool:
    if cls.requires or cls.supervises or cls.explores or cls.kind in _NEEDS_THE_CASE:
        return False
    if cls.attach is not RankSide.attach:
        return False  # it acts on the strategy object
    overridden = [name for name in ("setup", "supervise", "heal", "findings", "notes", "teardown")
                  if getattr(cls, name) is not getattr(HarnessSide, name)]
    return all(name in SCRIPT_HARNESS_HOOKS for name in overridden)


def check_script_fault(document: Any, source: str, world_size: int) -> FaultSpec:
    """The fault, checked as a scenario's is; errors name ``source``, the key, the bad value and
    what is allowed."""
    problems = Problems(source)
    v = Validator(source, "", problems)
    document = {"kind": "none"} if document is None else document
    kind = document.get("kind") if isinstance(document, dict) else document
    allowed = script_faults()
    if kind not in allowed and kind in registry.FAULTS:
        raise v.error("fault.kind", "needs what a script does not offer (a strategy's capability, the case's "
                      "workload, or supervision of the framework's own ranks)", kind, allowed)
    spec = v.section("fault", check_fault, v, document, ScriptBounds(world_size))
    problems.raise_any()
    return spec
