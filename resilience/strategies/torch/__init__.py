"""PyTorch's own checkpointing: ``torch.save`` on rank 0 or per rank (``native.py``), DCP with FSDP2
(``dcp.py``, ``dcp_objects.py``) and where these keep their files (``targets.py``)."""
from ..stack import Stack

STACK = Stack(
    name="torch",
    distributions=("torch",),
    # DCP and FSDP2 cost seconds of imports per rank otherwise; they start no threads
    preload=("torch.distributed.checkpoint", "torch.distributed.checkpoint.state_dict",
             "torch.distributed.fsdp", "torch.distributed.device_mesh",
             "torch.distributed.checkpoint._fsspec_filesystem",  # skipped where fsspec is not installed
             "resilience.strategies.torch.native", "resilience.strategies.torch.dcp"),
)
