"""The Hugging Face Trainer's own loop and checkpoints (``strategy.py``, ``engine.py``).

The library is imported absolutely (``import transformers`` names the distribution, not this
package) and only inside rank processes."""
from ..stack import Stack

STACK = Stack(
    name="transformers",
    distributions=("transformers",),
    # 10-15 s per rank otherwise (the Trainer pulls in Accelerate, and DeepSpeed where installed); no threads
    preload=("transformers.trainer", "transformers.trainer_callback", "transformers.training_args",
             "transformers.models.gpt2.modeling_gpt2", "resilience.strategies.transformers.engine"),
    requires="transformers",
)
