"""The `tp_mlp` workload's whole state, free of the topology: gathered from every shard for the
oracle's digests and the trusted snapshots (one file per data-parallel rank, whose streams differ
with ``rank_rng: distinct``), and sliced again for a rank's place in another topology."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist


def full_state(workload: Any, held: dict[str, dict[str, torch.Tensor]] | None = None) -> dict[str, Any]:
    """The unsharded model, optimizer and (with ``ema``) average, gathered from every shard
    (collective). ``held``: this rank's shard by name (``param`` and Adam's entries) where an
    engine owns it."""
    adam = workload.optimizer.state
    params = dict(workload.model.named_parameters())
    held = held if held is not None else {
        name: {"param": p.detach().clone(), **{k: v.clone() for k, v in adam.get(p, {}).items()}}
        for name, p in params.items()}
    averages = workload.average.state_dict() if workload.average is not None else {}
    held = {name: {**{key: value.cpu() for key, value in entry.items()},
                   **({"ema": averages[name].cpu()} if averages else {})} for name, entry in held.items()}
    coords = workload.coords
    pieces: list[Any] = [None] * workload.world_size
    dist.all_gather_object(pieces, (coords.tp, coords.pp, coords.dp, held))
    full: dict[str, dict[str, torch.Tensor]] = {}
    for name, dim in workload.split_dims.items():
        shards = sorted((tp, own[name]) for tp, _pp, dp, own in pieces if dp == 0 and name in own)
        full[name] = {entry: (shards[0][1][entry] if dim is None or entry == "step"
                              else torch.cat([s[entry] for _, s in shards], dim=dim))
                      for entry in shards[0][1]}
    group = {k: v for k, v in workload.optimizer.state_dict()["param_groups"][0].items() if k != "params"}
    state = {"model": {n: e["param"] for n, e in full.items()},
             "optimizer": {"state": {n: {k: v for k, v in e.items() if k not in ("param", "ema")}
                                     for n, e in full.items()}, "group": group},
             "scheduler": workload.scheduler.state_dict(), "step": workload.step, "data": workload.sampler.state()}
    if averages:
        state["ema"] = {n: e["ema"] for n, e in full.items()}
    return state


def save_snapshot(workload: Any, full: dict[str, Any], directory: Path) -> None:
    """``full`` with this rank's streams, written once per data-parallel rank."""
    if workload.coords.tp == 0 and workload.coords.pp == 0:
        directory.mkdir(parents=True, exist_ok=True)
        torch.save({**full, **workload.own_streams()}, directory / f"dp_{workload.coords.dp}.pt")


def load_snapshot(directory: Path, workload: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the trusted full state, the progress this rank restores from it: step, data position,
    the streams (this data-parallel rank's own where they are per rank; a rank new to the job
    keeps its seeded ones) and its shard of the average)."""
    full = torch.load(directory / "dp_0.pt", weights_only=True)
    own = directory / f"dp_{workload.coords.dp}.pt"
    streams = workload.own_streams()
    if workload.rank_local_keys:
        if own.exists():
            saved = torch.load(own, weights_only=True)
            streams = {key: saved[key] for key in streams}
    else:
        streams = {key: full[key] for key in streams}
    progress = {"step": full["step"], "data": full["data"], **streams}
    if workload.average is not None:
        progress["ema"] = {n: workload.shard(n, full["ema"][n]) for n in full["ema"]}
    return full, progress
