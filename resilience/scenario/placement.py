"""Where a case's ranks run: the TP x PP x DP topology and node placement of the first run, and the
restart (its world size, rank map, interpreter and topology), checked against the workload; and
the software every phase runs under."""
from __future__ import annotations

from typing import Any

from ..core import registry
from ..core.case import RestartSpec, Software, StrategySpec, WorkloadSpec
from ..core.topology import SHARED, STORAGE_KINDS, Topology
from .checks import Validator
from .schema import MAX_WORLD_SIZE, REQUIREMENT, RESTART_KEYS, SOFTWARE_KEYS, TOPOLOGY_KEYS


def check_topology(v: Validator, key: str, value: Any, world_size: int, workload: WorkloadSpec,
                   storage: str | None = None) -> Topology | None:
    """TP x PP x DP and node placement of ``world_size`` ranks; ``storage`` given: a restart's
    topology, which keeps the first run's storage (the cluster's, not the job's)."""
    if value is None:
        return None
    allowed = TOPOLOGY_KEYS if storage is None else TOPOLOGY_KEYS[:-1]
    doc = v.mapping(key, value, allowed)
    tp = v.integer(f"{key}.tp", doc.get("tp", 1), 1, world_size)
    pp = v.integer(f"{key}.pp", doc.get("pp", 1), 1, world_size)
    if world_size % (tp * pp):
        raise v.error(f"{key}.tp", f"tp x pp ({tp} x {pp}) must divide the world size ({world_size})", tp,
                      [t for t in range(1, world_size + 1) if world_size % (t * pp) == 0])
    dp = world_size // (tp * pp)
    cls = registry.resolve("workload", workload.model)
    if (tp, pp) != (1, 1) and not cls.model_parallel:
        raise v.error(f"{key}.tp", f"workload {workload.model!r} has no tensor or pipeline parallelism",
                      {"tp": tp, "pp": pp}, "tp: 1, pp: 1, or a model-parallel workload such as tp_mlp")
    if workload.global_batch % dp:
        raise v.error(f"{key}.tp", f"the data-parallel degree {dp} must divide workload.global_batch "
                                   f"({workload.global_batch})", tp)
    if cls.model_parallel:
        problem = cls.topology_problem(workload, tp, pp)
        if problem:
            raise v.error(f"{key}.tp", problem, {"tp": tp, "pp": pp})
    nodes = v.integer(f"{key}.nodes", doc.get("nodes", 1), 1, world_size, f"a divisor of the world size ({world_size})")
    if world_size % nodes:
        raise v.error(f"{key}.nodes", f"must divide the world size ({world_size}): ranks fill nodes in equal blocks",
                      nodes, [n for n in range(1, world_size + 1) if world_size % n == 0])
    node_ids = doc.get("node_ids", list(range(nodes)))
    if (not isinstance(node_ids, list) or len(node_ids) != nodes
            or not all(isinstance(n, int) and not isinstance(n, bool) and 0 <= n < 1024 for n in node_ids)
            or len(set(node_ids)) != nodes):
        raise v.error(f"{key}.node_ids", f"must list {nodes} distinct physical node numbers, one per block of ranks",
                      node_ids, f"e.g. {list(reversed(range(nodes)))}")
    if storage is None:
        storage = v.choice(f"{key}.storage", doc.get("storage", SHARED), STORAGE_KINDS)
    return Topology(tp=tp, pp=pp, dp=dp, node_ids=tuple(node_ids), storage=storage)


def check_restart(v: Validator, value: Any, workload: WorkloadSpec, topology: Topology | None = None) -> RestartSpec:
    doc = v.mapping("restart", value if value is not None else {}, RESTART_KEYS)
    world_size = v.integer("restart.world_size", doc.get("world_size", workload.world_size), 1, MAX_WORLD_SIZE)
    if workload.global_batch % world_size and not registry.resolve("workload", workload.model).model_parallel:
        raise v.error("restart.world_size", f"must divide workload.global_batch ({workload.global_batch})",
                      world_size, [w for w in range(1, MAX_WORLD_SIZE + 1) if workload.global_batch % w == 0])
    problem = registry.resolve("workload", workload.model).check_options(workload.options, world_size,
                                                                        workload.global_batch)
    if problem:
        raise v.error("restart.world_size", f"{problem[1]} at the restart", world_size, "a world size that splits it")
    mapping = _rank_map(v, doc.get("rank_map", "identity"), world_size, workload)
    software = check_software(v, "restart", doc)
    first = topology or Topology.single_node(workload.world_size)
    restart_topology = check_topology(v, "restart.topology", doc.get("topology"), world_size, workload,
                                      storage=first.storage)
    if restart_topology is None and topology is not None:  # the job comes back as it was placed
        if world_size % first.nodes == 0 and world_size % (first.tp * first.pp) == 0:
            restart_topology = Topology(tp=first.tp, pp=first.pp, dp=world_size // (first.tp * first.pp),
                                        node_ids=first.node_ids, storage=first.storage)
        else:
            raise v.error("restart.topology", f"missing: the first run's topology ({first.describe()}) "
                                              f"cannot hold {world_size} ranks", None, TOPOLOGY_KEYS[:-1])
    return RestartSpec(world_size=world_size, rank_map=mapping, python=software.python, packages=software.packages,
                       topology=restart_topology)


def check_software(v: Validator, where: str, doc: dict) -> Software:
    """The ``python`` or ``packages`` of ``doc`` (the case's ``software``, or the restart's own keys)."""
    python, packages = doc.get("python"), doc.get("packages", [])
    if python is not None and (not isinstance(python, str) or not python.strip() or "\0" in python):
        raise v.error(f"{where}.python", "must be the path of a Python interpreter", python,
                      "a path such as /opt/venv-old/bin/python")
    if not isinstance(packages, list) or not all(isinstance(r, str) and REQUIREMENT.match(r) for r in packages):
        raise v.error(f"{where}.packages", "must be a list of pip requirements", packages, "e.g. [deepspeed==0.17.6]")
    if python is not None and packages:
        raise v.error(f"{where}.packages", "give python or packages, not both", packages,
                      "packages layered over this environment, or another interpreter")
    return Software(python=python, packages=tuple(packages))


def check_case_software(v: Validator, value: Any, strategy: StrategySpec | None = None) -> Software:
    """A case's ``software``: what every phase runs under, the reference's included; first the
    packages its strategy runs with (`CheckpointStrategy.layered_packages`)."""
    layered = registry.resolve("strategy", strategy.name).layered_packages if strategy is not None else ()
    if value is None:
        return Software(packages=layered)
    doc = v.mapping("software", value, SOFTWARE_KEYS)
    software = check_software(v, "software", doc)
    if not software:
        raise v.error("software", "names no software", value, list(SOFTWARE_KEYS))
    if layered and software.python:
        raise v.error("software.python", f"strategy {strategy.name} runs with its own packages layered over this "
                      f"environment ({', '.join(layered)})", software.python, "packages")
    return Software(packages=layered + software.packages)


def _rank_map(v: Validator, rank_map: Any, world_size: int, workload: WorkloadSpec) -> tuple[int, ...]:
    """Which old rank's state each restarted rank loads: identity, reverse, or an explicit permutation."""
    if rank_map == "identity":
        mapping = tuple(range(world_size))
    elif rank_map == "reverse":
        mapping = tuple(reversed(range(world_size)))
    elif isinstance(rank_map, list) and all(
            isinstance(r, int) and not isinstance(r, bool) for r in rank_map) and sorted(rank_map) == list(
            range(world_size)):
        mapping = tuple(rank_map)
    else:
        raise v.error("restart.rank_map", "must be identity, reverse, or a permutation of the restart's ranks",
                      rank_map, f"identity, reverse, a list holding each of 0..{world_size - 1} once")
    if world_size != workload.world_size and mapping != tuple(range(world_size)):
        raise v.error("restart.rank_map", "a permuted rank map needs the same world size at restart",
                      rank_map, "identity")
    return mapping
