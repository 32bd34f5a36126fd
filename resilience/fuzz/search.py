"""Hypothesis search over save and restart topologies, in two tiers.

Fast tier: `fast_property` checks a strategy's `RestoreModel` on one save topology against many
restart topologies per example (placement, spare nodes, other TP/PP/DP degrees). Process tier:
`process_property` runs the real strategy in real ranks through the harness on a few pairs, and
checks that the verdict is RECOVERED or LOUD, and what the model predicted.

A failure shrinks (smaller degrees, fewer nodes, first node ids) and becomes a scenario file that
`python -m resilience run` replays with real processes.
"""
from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Callable

import yaml
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from ..core.case import VerdictKind
from ..core.topology import NODE_LOCAL, SHARED, Topology
from .models import RestoreModel, saved, verdict

ALLOWED = (VerdictKind.RECOVERED, VerdictKind.LOUD)
TP_DEGREES = (1, 2, 3, 4)  # all divide tp_mlp's hidden width at the fuzzed size
PP_DEGREES = (1, 2, 3)
MAX_DP = 4
GLOBAL_BATCH = 24  # divisible by every data-parallel degree drawn

settings.register_profile("ci", max_examples=300, deadline=None, derandomize=True, database=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("long", max_examples=20_000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])


class Counterexample(Exception):
    """A save/restart pair whose verdict is neither RECOVERED nor LOUD."""

    def __init__(self, save: Topology, restart: Topology, distinct_streams: bool, verdict: VerdictKind, why: str):
        super().__init__(save, restart, distinct_streams, verdict, why)
        self.save, self.restart, self.distinct_streams = save, restart, distinct_streams
        self.verdict, self.why = verdict, why

    def __str__(self) -> str:
        return (f"{self.verdict.value}: saved at {self.save.describe()}, restored at {self.restart.describe()}"
                f"{' (distinct noise streams)' if self.distinct_streams else ''}: {self.why}")


@st.composite
def topologies(draw, storage: str, max_world: int = 16, spare_nodes: bool = True) -> Topology:
    """A TP x PP x DP topology of at most ``max_world`` ranks, in blocks on distinct nodes (drawn
    from twice as many node ids as it uses when ``spare_nodes``: some may be new to the job)."""
    tp = draw(st.sampled_from(TP_DEGREES))
    pp = draw(st.sampled_from(PP_DEGREES))
    dp = draw(st.integers(1, max(1, min(MAX_DP, max_world // (tp * pp)))))
    world = tp * pp * dp
    nodes = draw(st.sampled_from([n for n in range(1, world + 1) if world % n == 0]))
    pool = list(range(2 * nodes if spare_nodes else nodes))
    node_ids = draw(st.permutations(pool))[:nodes]
    return Topology(tp=tp, pp=pp, dp=dp, node_ids=tuple(node_ids), storage=storage)


def random_topology(rnd, storage: str, max_world: int = 16, spare_nodes: bool = True) -> Topology:
    """`topologies` drawn from a plain random generator: the fast tier checks hundreds per example."""
    tp, pp = rnd.choice(TP_DEGREES), rnd.choice(PP_DEGREES)
    dp = rnd.randint(1, max(1, min(MAX_DP, max_world // (tp * pp))))
    world = tp * pp * dp
    nodes = rnd.choice([n for n in range(1, world + 1) if world % n == 0])
    node_ids = rnd.sample(range(2 * nodes if spare_nodes else nodes), nodes)
    return Topology(tp=tp, pp=pp, dp=dp, node_ids=tuple(node_ids), storage=storage)


def fast_property(model_factory: Callable[[bool], RestoreModel], storage: str | None = None,
                  restarts_per_example: int = 256, max_world: int = 16, counter: list[int] | None = None):
    """A Hypothesis test (call it to run): one drawn save topology, then ``restarts_per_example``
    restart topologies against the restore model ``model_factory(distinct_streams)``."""
    from hypothesis import given

    @st.composite
    def examples(draw):
        kind = draw(st.just(storage) if storage else st.sampled_from((SHARED, NODE_LOCAL)))
        seed = draw(st.integers(0, 2**32 - 1))  # a plain generator: Hypothesis's own records every call
        return kind, draw(topologies(kind, max_world, spare_nodes=False)), draw(st.booleans()), random.Random(seed)

    @given(examples())
    def check(example):
        kind, save, distinct, rnd = example
        model = model_factory(distinct)
        disks = saved(save, model)
        for _ in range(restarts_per_example):
            restart = random_topology(rnd, kind, max_world)
            found, why = verdict(save, restart, model, disks)
            if counter is not None:
                counter[0] += 1
            if found not in ALLOWED:
                raise Counterexample(save, restart, distinct, found, why)

    return check


def run_fast(model_factory: Callable[[bool], RestoreModel], storage: str | None = None,
             profile: str = "ci", max_examples: int | None = None) -> tuple[Counterexample | None, int, float]:
    """Run the fast tier; returns the minimal counterexample (or None), maps checked, seconds."""
    counter = [0]
    test = fast_property(model_factory, storage, counter=counter)
    chosen = settings(settings.get_profile(profile), **({"max_examples": max_examples} if max_examples else {}))
    started = time.monotonic()
    try:
        chosen(test)()
    except Counterexample as found:
        return minimize(found, model_factory), counter[0], time.monotonic() - started
    return None, counter[0], time.monotonic() - started


def _smaller(topology: Topology):
    """Topologies one step simpler than ``topology``: a lower degree, fewer nodes, lower node ids."""
    for tp in (t for t in TP_DEGREES if t < topology.tp):
        yield topology.tp, tp, "tp"
    for pp in (p for p in PP_DEGREES if p < topology.pp):
        yield topology.pp, pp, "pp"
    for dp in range(1, topology.dp):
        yield topology.dp, dp, "dp"


def _variants(topology: Topology):
    t = topology
    for _, value, key in _smaller(t):
        degrees = {"tp": t.tp, "pp": t.pp, "dp": t.dp, key: value}
        world = degrees["tp"] * degrees["pp"] * degrees["dp"]
        for nodes in (n for n in range(1, t.nodes + 1) if world % n == 0):
            yield Topology(node_ids=t.node_ids[:nodes] if nodes <= t.nodes else t.node_ids, storage=t.storage,
                           **degrees)
    for nodes in (n for n in range(1, t.nodes) if t.world_size % n == 0):
        yield Topology(t.tp, t.pp, t.dp, t.node_ids[:nodes], t.storage)
    ordered = tuple(sorted(t.node_ids))
    if ordered != t.node_ids:
        yield Topology(t.tp, t.pp, t.dp, ordered, t.storage)
    for index, node in enumerate(t.node_ids):
        for lower in (n for n in range(node) if n not in t.node_ids):
            yield Topology(t.tp, t.pp, t.dp, t.node_ids[:index] + (lower,) + t.node_ids[index + 1:], t.storage)


def _size(found: Counterexample) -> tuple:
    return (found.save.world_size + found.restart.world_size, found.save.nodes + found.restart.nodes,
            found.distinct_streams, sum(found.save.node_ids) + sum(found.restart.node_ids))


def minimize(found: Counterexample, model_factory: Callable[[bool], RestoreModel]) -> Counterexample:
    """Greedily simplify both topologies together (Hypothesis shrinks them one at a time, and a
    lone smaller save topology usually turns the restart into a loud mismatch)."""
    improved = True
    while improved:
        improved = False
        candidates = [(s, r, d) for s in (found.save, *_variants(found.save))
                      for r in (found.restart, *_variants(found.restart))
                      for d in ({found.distinct_streams, False})]
        for save, restart, distinct in candidates:
            kind, why = verdict(save, restart, model_factory(distinct))
            candidate = Counterexample(save, restart, distinct, kind, why)
            if kind not in ALLOWED and _size(candidate) < _size(found):
                found, improved = candidate, True
                break
    return found


def scenario_document(strategy: str, options: dict, save: Topology, restart: Topology, distinct_streams: bool,
                      description: str) -> dict:
    """A scenario that runs a save/restart pair with real ranks: save at ``save``, a rank killed
    after the step-4 checkpoint, restart at ``restart``."""
    def section(topology: Topology, with_storage: bool) -> dict:
        doc = {"tp": topology.tp, "pp": topology.pp, "nodes": topology.nodes, "node_ids": list(topology.node_ids)}
        return {**doc, "storage": topology.storage} if with_storage else doc

    return {
        "name": f"fuzzed topology change for {strategy}",
        "description": description,
        "strategy": {"name": strategy, "options": dict(options)} if options else strategy,
        "workload": {"model": "tp_mlp", "world_size": save.world_size, "steps": 8, "checkpoint_every": 4,
                     "seed": 0, "global_batch": GLOBAL_BATCH,
                     "rank_rng": "distinct" if distinct_streams else "same"},
        "topology": section(save, True),
        "fault": {"kind": "kill", "rank": save.world_size - 1, "step": 6, "phase": "train"},
        "restart": {"world_size": restart.world_size, "topology": section(restart, False)},
        "timeouts": {"collective": 10},
        "expect": "recovers",
    }


def write_scenario(directory: Path, strategy: str, options: dict, found: Counterexample) -> Path:
    document = scenario_document(strategy, options, found.save, found.restart, found.distinct_streams,
                                 f"Found by resilience fuzz: {found}")
    return write_document(directory, "fuzz", strategy, document)


def write_document(directory: Path, prefix: str, strategy: str, document: dict) -> Path:
    """A found scenario as a file that `python -m resilience run` replays."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{prefix}_{strategy.replace(':', '_').replace('.', '_')}.scenario.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def process_property(strategy: str, options: dict, model_factory: Callable[[bool], RestoreModel] | None,
                     run_case: Callable[[dict], VerdictKind], storage: str = SHARED, max_world: int = 4):
    """A Hypothesis test (call it to run) over real ranks: ``run_case(scenario_document)`` runs the
    case through the harness and returns its verdict, which must be RECOVERED or LOUD, and what
    the restore model predicts when there is one."""
    from hypothesis import given

    @given(topologies(storage, max_world, spare_nodes=False), topologies(storage, max_world), st.booleans())
    def check(save, restart, distinct):
        predicted = verdict(save, restart, model_factory(distinct))[0] if model_factory else None
        got = run_case(scenario_document(strategy, options, save, restart, distinct,
                                         f"resilience fuzz probe: saved at {save.describe()}, restored at "
                                         f"{restart.describe()}"))
        if predicted is not None:
            assert got == predicted, f"the restore model predicted {predicted.value}, the real run gave {got.value}"
        if got not in ALLOWED:
            raise Counterexample(save, restart, distinct, got, "the real run")

    return check
