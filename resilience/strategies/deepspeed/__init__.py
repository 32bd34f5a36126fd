"""DeepSpeed's ZeRO stages 1-3 (``zero.py``) on the engine that trains the workload (``engine.py``)."""
from ..stack import Stack

STACK = Stack(
    name="deepspeed",
    distributions=("deepspeed",),
    # seconds per rank, much of it torch.compile's stack, which its optimizer registry pulls in
    preload=("deepspeed", "deepspeed.runtime.engine", "deepspeed.runtime.zero.stage_1_and_2",
             "deepspeed.runtime.zero.stage3",
             "deepspeed.runtime.zero.muon.muon_optimizer",  # recent releases only (not 0.17.x)
             "deepspeed.checkpoint", "deepspeed.utils", "resilience.strategies.deepspeed.zero"),
    requires="deepspeed",
    cpu_environment={"DS_ACCELERATOR": "cpu"},
    install_environment={"DS_BUILD_OPS": "0"},  # no CUDA op builds when pip installs another release
)
