"""The generative audit: whole scenarios drawn by Hypothesis and run in real ranks, the process
tier of `resilience fuzz` over faults as well as topologies.

One drawn `Draw` is a scenario without its strategy: world size 2 to 4, steps and checkpoint
interval (many checkpoints, step numbers of one and two digits), and a fault among those the
catalogue's catchers use (a kill in training or mid-write, disk full, damage at rest of the files
a rank wrote, a stale pointer, a newer version, a power cut), its rank and step, its target named
by behaviour (`resilience.disk.trace_targets`). It is judged as a catcher judges
(`planted.trials.run_trial`, which `planted.auditor` hands in): caught when its verdict is not one
a correct strategy may give. A draw whose fault never acts on the strategy is rejected, not
counted as passed.

Budgets are in real runs: ``search`` for Hypothesis's generation (shrinking is off there), then
``shrink`` for the greedy shrink below, which tries one-step-simpler draws and keeps the first
that is still caught, until none is or the budget is spent. ``runs()`` says how many real runs the
judge has made so far (a correct twin run beside a caught draw counts too).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Iterator

from hypothesis import HealthCheck, Phase, assume, given, seed, settings
from hypothesis import strategies as st
from hypothesis.errors import Flaky

from ..core.case import VerdictKind

RECOVERED, LOUD = VerdictKind.RECOVERED, VerdictKind.LOUD
STEPS = (12, 10, 16, 8, 20, 6)  # the first is what a derandomized search draws first
INTERVALS = (2, 4, 3, 1, 5)
# fault -> (what a correct strategy may give, damage at rest: an older checkpoint is right)
FAULTS: dict[str, tuple[frozenset, bool]] = {
    "none": (frozenset({RECOVERED}), False),
    "kill_train": (frozenset({RECOVERED}), False),
    "kill_write": (frozenset({RECOVERED, LOUD}), False),
    "disk_full": (frozenset({RECOVERED, LOUD}), False),
    "bit_flip": (frozenset({RECOVERED, LOUD}), True),
    "truncate": (frozenset({RECOVERED, LOUD}), True),
    "missing_file": (frozenset({RECOVERED, LOUD}), True),
    "duplicate_file": (frozenset({RECOVERED, LOUD}), True),
    "malicious_pickle": (frozenset({RECOVERED, LOUD}), True),
    "stale_pointer": (frozenset({RECOVERED, LOUD}), False),
    "version_mismatch": (frozenset({LOUD}), False),
    "power_loss": (frozenset({RECOVERED, LOUD}), False),
}
SIMPLER = tuple(FAULTS)  # the order faults shrink towards


@dataclass(frozen=True)
class Draw:
    world_size: int
    steps: int
    every: int
    fault: str
    rank: int  # the fault's rank (and, for damage, whose files)
    step: int  # the fault's step: a train step, or a checkpoint step for faults at a save
    distinct_streams: bool

    @property
    def checkpoints(self) -> tuple[int, ...]:
        return tuple(range(self.every, self.steps + 1, self.every))

    def size(self) -> tuple:
        return (self.world_size, self.steps, len(self.checkpoints), SIMPLER.index(self.fault), self.rank,
                self.step, self.distinct_streams)

    def describe(self) -> str:
        where = "" if self.fault == "none" else f" on rank {self.rank} at step {self.step}"
        return (f"{self.world_size} ranks, {self.steps} steps, checkpoints every {self.every} "
                f"({len(self.checkpoints)}), {self.fault}{where}"
                f"{', per-rank RNG streams' if self.distinct_streams else ''}")

    def fault_document(self) -> dict:
        r, s, f = self.rank, self.step, self.fault
        mine = f"@written_by:{r}"
        return {
            "none": {"kind": "none"},
            "kill_train": {"kind": "kill", "rank": r, "step": s, "phase": "train"},
            "kill_write": {"kind": "kill", "rank": r, "step": s, "point": "write", "after_bytes": 4096},
            "disk_full": {"kind": "disk_full", "via": "quota", "rank": r, "step": s, "point": "write",
                          "after_bytes": 8192},
            "bit_flip": {"kind": "bit_flip", "rank": r, "step": s, "file": mine},
            "truncate": {"kind": "truncate", "rank": r, "step": s, "file": mine},
            "missing_file": {"kind": "missing_file", "rank": r, "step": s, "file": mine},
            "duplicate_file": {"kind": "duplicate_file", "rank": r, "step": s, "file": mine,
                               "source": f"@written_by:{(r + 1) % self.world_size}"},
            "malicious_pickle": {"kind": "malicious_pickle", "rank": r, "step": s, "file": mine},
            "stale_pointer": {"kind": "stale_pointer", "rank": r, "step": s, "file": "@pointer"},
            "version_mismatch": {"kind": "version_mismatch", "rank": r, "step": s, "version": "newer"},
            "power_loss": {"kind": "power_loss", "step": s},
        }[f]

    def document(self) -> dict:
        """The drawn scenario without strategy and expect (a catcher's document)."""
        workload = {"model": "mlp", "world_size": self.world_size, "steps": self.steps,
                    "checkpoint_every": self.every, "seed": 0,
                    "rank_rng": "distinct" if self.distinct_streams else "same", "global_batch": 24}
        return {"workload": workload, "fault": self.fault_document(), "timeouts": {"collective": 20, "phase": 60}}


@st.composite
def draws(draw) -> Draw:
    world = draw(st.integers(2, 4))
    steps, every = draw(st.sampled_from(STEPS)), draw(st.sampled_from(INTERVALS))
    checkpoints = tuple(range(every, steps + 1, every))
    assume(checkpoints)
    fault = draw(st.sampled_from(SIMPLER))
    at_save = fault not in ("none", "kill_train")
    step = draw(st.sampled_from(checkpoints)) if at_save else draw(st.integers(1, steps))
    if fault == "stale_pointer":
        assume(step != checkpoints[0])  # a pointer one save back needs an earlier save
    return Draw(world, steps, every, fault, draw(st.integers(0, world - 1)), step, draw(st.booleans()))


class Found(Exception):
    """A drawn scenario the strategy fails (a catcher would have caught it)."""

    def __init__(self, found: Draw, trial: Any):
        super().__init__(found, trial)
        self.draw, self.trial = found, trial


def search(judge: Callable[[Draw], str], profile: str, budget: int, key: int = 0,
           runs: Callable[[], int] | None = None) -> Draw | None:
    """Hypothesis's generation over ``draws()`` with at most ``budget`` real runs. ``judge``
    returns the `run_trial` judgement: "caught" ends the search, anything but "accepted" (the fault
    never acted, the correct twin fails it too) rejects the draw. Under the derandomized ``ci``
    profile the draws come from the seed ``key`` (the strategy's name, say): reproducible, yet not
    the same few draws for every strategy."""
    judged: dict[Draw, str] = {}  # Hypothesis replays a failing draw (and may draw one twice): run each once
    caught: list[Draw] = []
    spent = runs or (lambda: len(judged))

    @given(draws())
    def check(candidate: Draw) -> None:
        if candidate not in judged:
            if spent() >= budget:
                return  # the budget is spent: Hypothesis draws on, nothing runs
            judged[candidate] = judge(candidate)
        assume(judged[candidate] in ("caught", "accepted"))  # a fault that never acted, or a harness error
        if judged[candidate] == "caught":
            caught.append(candidate)
            raise Found(candidate, judged[candidate])

    if settings.get_profile(profile).derandomize:
        check = seed(key)(check)
    chosen = settings(settings.get_profile(profile), max_examples=max(budget * 4, budget + 10), derandomize=False,
                      phases=(Phase.explicit, Phase.generate),
                      # one search after another in a process (never nested) trips nested_given once seeded
                      suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                             HealthCheck.nested_given])
    try:
        chosen(check)()
    except (Found, Flaky):  # Flaky: a replay Hypothesis made past the budget; the catch stands
        if not caught:
            raise
    return caught[0] if caught else None


def simpler(d: Draw) -> Iterator[Draw]:
    """Draws one step simpler than ``d``: fewer ranks, fewer steps or checkpoints, a simpler fault,
    a lower rank or step, one noise stream."""
    if d.world_size > 2:
        yield replace(d, world_size=d.world_size - 1, rank=min(d.rank, d.world_size - 2))
    for steps in sorted(s for s in STEPS if s < d.steps):
        fits = d.step <= steps and (d.fault in ("none", "kill_train") or d.step % d.every == 0)
        yield replace(d, steps=steps, step=d.step if fits else min(steps, max(d.every, steps - steps % d.every)))
    for every in sorted(i for i in INTERVALS if i > d.every and i <= d.steps):
        step = d.step if d.fault in ("none", "kill_train") else every * max(1, d.step // every)
        yield replace(d, every=every, step=min(step, d.steps - d.steps % every))
    for fault in SIMPLER[:SIMPLER.index(d.fault)]:
        yield replace(d, fault=fault)
    if d.rank:
        yield replace(d, rank=0)
    lower = d.step - (1 if d.fault in ("none", "kill_train") else d.every)
    if lower >= (1 if d.fault in ("none", "kill_train") else d.every):
        yield replace(d, step=lower)
    if d.distinct_streams:
        yield replace(d, distinct_streams=False)


def shrink(found: Draw, judge: Callable[[Draw], str], budget: int,
           runs: Callable[[], int] | None = None) -> tuple[Draw, int]:
    """The smallest draw still caught that ``budget`` runs reach, and the runs spent."""
    before = runs() if runs else 0
    spent, improved = 0, True
    while improved and spent < budget:
        improved = False
        for candidate in simpler(found):
            if candidate.size() >= found.size() or not candidate.checkpoints:
                continue
            if spent >= budget:
                break
            caught = judge(candidate) == "caught"
            spent = runs() - before if runs else spent + 1
            if caught:
                found, improved = candidate, True
                break
    return found, spent
