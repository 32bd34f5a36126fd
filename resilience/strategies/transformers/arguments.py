"""What a scenario's ``strategy.options`` make of the Trainer: the ``TrainingArguments`` and the
model, checked in the harness (``option_problem``) and built in the ranks (``training_arguments``,
``causal_lm``). The harness owns the arguments that decide when the job steps, saves, logs and
where it writes (``HARNESS_ARGUMENTS``); everything else of ``TrainingArguments`` a user may set
through the ``training_arguments`` option, and their own ``PreTrainedModel`` class through
``model`` and ``model_config``."""
from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Mapping
from typing import Any

#: set by the harness from the workload spec and the phase: a scenario may not set them
HARNESS_ARGUMENTS = frozenset({
    "output_dir", "use_cpu", "ddp_backend", "report_to", "max_steps", "num_train_epochs", "save_strategy",
    "save_steps", "logging_strategy", "logging_steps", "disable_tqdm", "per_device_train_batch_size",
    "remove_unused_columns", "eval_strategy", "do_eval", "push_to_hub"})
#: options of the strategy that are ``TrainingArguments`` of the same name, passed as they are
DIRECT_ARGUMENTS = ("save_total_limit", "gradient_accumulation_steps", "dataloader_num_workers", "data_seed",
                    "ignore_data_skip", "save_only_model", "eval_steps", "load_best_model_at_end")
FLAGS = ("ignore_data_skip", "save_only_model", "load_best_model_at_end")
EVAL_EXAMPLES = 32  # the held-out set that eval_steps evaluates
Problem = tuple[str, str, Any, Any]


def option_problem(options: Mapping[str, Any]) -> Problem | None:
    """The first problem of ``options`` the strategy's ``option_values`` cannot say, as
    ``(key, problem, value, allowed)``."""
    for name, allowed in (("seed", "0, 1, 2, ..."), ("data_seed", "0, 1, 2, ...")):
        value = options.get(name, 0)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            return (f"strategy.options.{name}", "must be an integer >= 0", value, allowed)
    dropout = options.get("dropout", 0.0)
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0 <= dropout < 1:
        return ("strategy.options.dropout", "must be a probability", dropout, "0 <= p < 1")
    if options.get("load_best_model_at_end") and not options.get("eval_steps"):
        return ("strategy.options.load_best_model_at_end", "needs eval_steps (the Trainer keeps the best "
                "of its evaluations)", True, "eval_steps: N beside it")
    return _model_problem(options) or _arguments_problem(options.get("training_arguments", {}))


def _model_problem(options: Mapping[str, Any]) -> Problem | None:
    name = options.get("model")
    if name is None:
        if "model_config" in options:
            return ("strategy.options.model_config", "configures the model option's class", options["model_config"],
                    "model: package.module:Class beside it")
        return None
    if not isinstance(name, str) or name.count(":") != 1 or name.startswith(":") or name.endswith(":"):
        return ("strategy.options.model", "must name a PreTrainedModel class", name, "package.module:Class")
    if "dropout" in options:
        return ("strategy.options.dropout", "applies to the built-in GPT-2 only", options["dropout"],
                "the dropout keys of your config in model_config")
    config = options.get("model_config", {})
    if not isinstance(config, Mapping) or not all(isinstance(key, str) for key in config):
        return ("strategy.options.model_config", "must map config arguments to values", config,
                "a mapping such as {vocab_size: 32, hidden_size: 8}")
    return None


def _arguments_problem(arguments: Any) -> Problem | None:
    key = "strategy.options.training_arguments"
    if not isinstance(arguments, Mapping) or not all(isinstance(name, str) for name in arguments):
        return (key, "must map TrainingArguments names to values", arguments, "a mapping such as {weight_decay: 0.1}")
    for name in arguments:
        if name in HARNESS_ARGUMENTS:
            return (f"{key}.{name}", "is set by the harness from the workload and the phase", name,
                    "any other TrainingArguments field")
        if name in (*DIRECT_ARGUMENTS, "seed"):
            return (f"{key}.{name}", "is an option of the strategy itself", name, f"strategy.options.{name}")
    if arguments and importlib.util.find_spec("transformers") is not None:  # else: unavailable, said at run
        import dataclasses

        from transformers import TrainingArguments  # only where the option is used: a few seconds

        fields = {field.name for field in dataclasses.fields(TrainingArguments) if field.init}
        for name in arguments:
            if name not in fields:
                return (f"{key}.{name}", "is not a TrainingArguments field", name, "a field of TrainingArguments")
    return None


def fingerprint(options: Mapping[str, Any]) -> str:
    """The options that decide the numbers a run computes, for the reference cache's key."""
    keys = ("gradient_accumulation_steps", "dataloader_num_workers", "seed", "data_seed", "dropout", "epoch_steps",
            "ignore_data_skip", "eval_steps", "model", "model_config", "training_arguments")
    return "-".join(repr(options.get(key, "")) for key in keys)


def training_arguments(options: Mapping[str, Any], output_dir: str, world_size: int, global_batch: int,
                       seed: int, steps: int, save_every: int | None) -> Any:
    """The ``TrainingArguments`` of one phase. ``save_every``: the save interval, None in a phase
    that does not save (the reference, the continuation): ``load_best_model_at_end`` applies to
    saving phases only, as the Trainer refuses it without a save strategy."""
    from transformers import TrainingArguments

    accumulation = int(options.get("gradient_accumulation_steps", 1))
    direct = {name: options[name] for name in DIRECT_ARGUMENTS if name in options}
    if save_every is None:
        direct.pop("load_best_model_at_end", None)
    if "eval_steps" in options:
        direct["eval_strategy"] = "steps"
    defaults = {"per_device_eval_batch_size": 4, "learning_rate": 1e-2}  # the user's training_arguments win
    return TrainingArguments(
        output_dir=output_dir, use_cpu=True, ddp_backend="gloo", report_to=[], max_steps=steps,
        save_strategy="steps" if save_every else "no", save_steps=save_every or 1,
        logging_strategy="steps", logging_steps=1, disable_tqdm=True,
        per_device_train_batch_size=global_batch // (world_size * accumulation),
        seed=int(options.get("seed", seed)),
        remove_unused_columns=False,  # the items' indices reach the collator
        **{**defaults, **dict(options.get("training_arguments", {})), **direct})


def causal_lm(options: Mapping[str, Any], seed: int, default: Any) -> Any:
    """The model, initialised from ``seed`` (every rank the same bits): the user's class
    (``model: package.module:Class``) built from its own config class with ``model_config``, or
    ``default(dropout)``, the built-in GPT-2."""
    import torch

    torch.manual_seed(seed)
    name = options.get("model")
    if name is None:
        return default(float(options.get("dropout", 0.0)))
    model_class = model_class_named(name)
    return model_class(model_class.config_class(**dict(options.get("model_config", {}))))


def model_class_named(name: str) -> type:
    """The class ``package.module:Class`` names (imported: its source keys the reference cache)."""
    module, _, attribute = name.partition(":")
    return getattr(importlib.import_module(module), attribute)
