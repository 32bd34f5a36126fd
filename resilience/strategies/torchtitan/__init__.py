"""torchtitan's checkpoint manager as a system under test (``strategy.py``, ``engine.py``, the CPU
shims in ``cpu.py``).

torchtitan cannot share this environment with the other extras (its dependencies cap fsspec below
what s3fs pins), so every phase of a case on it runs with ``PACKAGES`` layered over this
environment (`Case.software`): installed once without their dependencies, and cached. The library
is imported only inside those rank processes."""
from ..stack import Stack

#: torchtitan and what it imports that this environment lacks (checked by importing its checkpoint
#: manager, optimizer, LR scheduler, dataloader, llama3 model and FSDP2 code at 0.3.0): tyro at
#: config/manager.py:14 and its docstring parser, spmd_types at components/loss.py:12, typeguard
#: (tyro's, lazily). Its other requirements (datasets, wandb, tensorboard, torch_checkpointing)
#: serve code this strategy never imports.
PACKAGES = ("torchtitan==0.3.0", "tyro==1.0.17", "docstring-parser==0.18.0", "spmd_types==0.2.3",
            "typeguard==4.6.1")

STACK = Stack(
    name="torchtitan",
    distributions=("torchtitan",),
    requires="torchtitan",  # never installed here: the fork server preloads nothing of it
)
