"""Hugging Face Accelerate's ``save_state``/``load_state`` (``strategy.py``, ``engine.py``), also
around a user's own training function (``user.py``)."""
from ..stack import Stack

STACK = Stack(name="accelerate", distributions=("accelerate",))
