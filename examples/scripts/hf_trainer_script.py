"""A Hugging Face ``Trainer`` script of the common shape: a small GPT-2 built from its config (no
download), a tokenised data set held in memory, ``TrainingArguments`` with ``save_steps`` and
``output_dir``, and a resume from the newest ``checkpoint-N`` folder where one exists
(``transformers.trainer_utils.get_last_checkpoint``), as the examples in transformers' own
repository do. Under torchrun the Trainer runs DDP over gloo on CPU; it logs the loss averaged
over the ranks.

    torchrun --standalone --nproc-per-node 2 examples/scripts/hf_trainer_script.py --output-dir out

The Trainer writes ``checkpoint-N/`` in place (model.safetensors, optimizer.pt, scheduler.pt, one
rng_state_<rank>.pth per rank, trainer_state.json) with no temporary name and no completion
marker, and ``get_last_checkpoint`` takes the highest-numbered folder without looking inside.
"""
import argparse
import os

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments, set_seed
from transformers.trainer_utils import get_last_checkpoint

VOCAB, LENGTH = 32, 8


class CountingText(torch.utils.data.Dataset):
    """Sequences that count by a stride modulo the vocabulary: something a model can learn."""

    def __init__(self, examples, seed):
        generator = torch.Generator().manual_seed(seed + 1)
        starts = torch.randint(0, VOCAB, (examples, 1), generator=generator)
        strides = torch.randint(1, 4, (examples, 1), generator=generator)
        self.tokens = (starts + strides * torch.arange(LENGTH)) % VOCAB

    def __len__(self):
        return len(self.tokens)

    def __getitem__(self, index):
        return {"input_ids": self.tokens[index], "labels": self.tokens[index]}


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--max-steps", type=int, default=12)
    parser.add_argument("--save-steps", type=int, default=4)
    parser.add_argument("--dropout", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.set_num_threads(1)
    set_seed(args.seed)
    config = GPT2Config(vocab_size=VOCAB, n_positions=LENGTH, n_embd=16, n_layer=1, n_head=2,
                        resid_pdrop=args.dropout, embd_pdrop=args.dropout, attn_pdrop=args.dropout,
                        bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1)
    model = GPT2LMHeadModel(config)
    training_args = TrainingArguments(
        output_dir=args.output_dir, max_steps=args.max_steps, save_strategy="steps",
        save_steps=args.save_steps, per_device_train_batch_size=4, learning_rate=1e-2,
        logging_steps=1, seed=args.seed, use_cpu=True, ddp_backend="gloo", report_to=[],
        disable_tqdm=True)
    trainer = Trainer(model=model, args=training_args, train_dataset=CountingText(256, args.seed))
    last = get_last_checkpoint(args.output_dir) if os.path.isdir(args.output_dir) else None
    trainer.train(resume_from_checkpoint=last)


if __name__ == "__main__":
    main()
