"""PyTorch Lightning's own loop and ``ModelCheckpoint`` (``strategy.py``, ``engine.py``)."""
from ..stack import Stack

STACK = Stack(
    name="lightning",
    distributions=("pytorch-lightning",),
    # 0.5 to 1 s per rank otherwise (pytorch_lightning pulls in torchmetrics and its loggers); no threads
    preload=("pytorch_lightning", "resilience.strategies.lightning.engine"),
    requires="pytorch_lightning",
)
