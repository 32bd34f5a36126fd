"""PyTorch Lightning's own loop and ``ModelCheckpoint`` (``strategy.py``, ``engine.py``)."""
from ..stack import Stack

STACK = Stack(name="lightning", distributions=("pytorch-lightning",))
