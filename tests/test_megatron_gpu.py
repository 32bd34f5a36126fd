"""megatron_core and megatron_deepspeed on GPUs: the real libraries under NCCL, each rank on its own
GPU, with no CPU stub applied. Marked ``gpu``: deselected where CUDA is missing (tests/conftest.py),
so a CPU machine neither runs nor skips them."""
from __future__ import annotations

import pytest
import torch

from resilience.core.case import VerdictKind
from resilience.run.harness import Harness
from resilience.strategies.megatron import core_cpu as megatron_core_cpu

from .harness_helpers import case_from

pytestmark = pytest.mark.gpu
TP_MLP = {"model": "tp_mlp", "world_size": 2, "steps": 8, "checkpoint_every": 4, "seed": 0}
KILL = {"kind": "kill", "rank": 1, "step": 6, "phase": "train"}


def _two_gpus() -> None:
    if torch.cuda.device_count() < 2:
        pytest.fail(f"needs 2 GPUs (tp=2, a GPU per rank), this machine has {torch.cuda.device_count()}")


def _placements(result, phase: str) -> set[tuple[str, str]]:
    ran = next(p for p in result.phases if p.name == phase)
    return {(e["backend"], e["device"]) for e in ran.events("joined")}


def test_no_cpu_stub_is_applied_where_cuda_exists():
    synchronize, current_device = torch.cuda.synchronize, torch.cuda.current_device
    assert megatron_core_cpu.apply_cpu_stubs() == ()
    assert torch.cuda.synchronize is synchronize and torch.cuda.current_device is current_device
    assert isinstance(torch.cuda.current_device(), int)  # the real call: an index, never the CPU device


@pytest.mark.parametrize("options, expect", [
    ({}, "recovers"),
    ({"fully_parallel": True}, "recovers"),
    ({"async": True}, {"outcome": "recovers", "fallback_ok": True}),
])
def test_megatron_core_restores_under_nccl(tmp_path, options, expect):
    _two_gpus()
    case = case_from(strategy={"name": "megatron_core", "options": options}, workload=TP_MLP,
                     topology={"tp": 2}, fault=KILL, expect=expect)
    result = Harness(work_root=tmp_path).run(case)
    assert result.verdict.kind is VerdictKind.RECOVERED, result.verdict.findings
    assert _placements(result, "restart") == {("nccl", "cuda:0"), ("nccl", "cuda:1")}


def test_megatron_core_reshards_to_another_tensor_parallel_size_under_nccl(tmp_path):
    _two_gpus()
    case = case_from(strategy="megatron_core", workload=TP_MLP, topology={"tp": 2}, fault=KILL,
                     restart={"world_size": 1, "topology": {"tp": 1}})
    result = Harness(work_root=tmp_path).run(case)
    assert result.verdict.kind is VerdictKind.RECOVERED, result.verdict.findings
    assert _placements(result, "restart") == {("nccl", "cuda:0")}


def test_megatron_deepspeed_restores_under_nccl(tmp_path):
    _two_gpus()
    case = case_from(strategy="megatron_deepspeed", workload=TP_MLP, topology={"tp": 2}, fault=KILL)
    result = Harness(work_root=tmp_path).run(case)
    assert result.verdict.kind is VerdictKind.RECOVERED, result.verdict.findings
    assert _placements(result, "restart") == {("nccl", "cuda:0"), ("nccl", "cuda:1")}
