"""Parameter-efficient fine-tuning of the encoder with BERT's own head, as the literature's
peers do it: LoRA (the peft library) and BitFit (biases only). Each returns the task model with
every parameter it leaves frozen set to ``requires_grad`` False; the baseline's training loop
then trains it (``EncoderSession(adapt=...)``)."""

from __future__ import annotations

from bertvision.config.settings import LoraPeer
from bertvision.errors import ConfigError
from bertvision.registry.task_spec import TaskSpec


def lora(settings: LoraPeer, task: TaskSpec):
    """LoRA adapters on ``settings.target_modules`` and the task's new output layer trained
    (peft's modules_to_save for its task type)."""

    def adapt(model):
        import warnings

        from peft import LoraConfig, TaskType, get_peft_model

        # peft asks transformers' deprecated is_gradient_checkpointing: a FutureWarning in every
        # LoRA job's log that the user can do nothing about
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)

        check_targets(model, settings.target_modules)
        kind = TaskType.QUESTION_ANS if task.kind == "span" else TaskType.SEQ_CLS
        config = LoraConfig(
            task_type=kind,
            r=settings.rank,
            lora_alpha=settings.alpha,
            lora_dropout=settings.dropout,
            target_modules=list(settings.target_modules),
        )
        return get_peft_model(model, config)

    return adapt


def check_targets(model, targets) -> None:
    """Each of ``targets`` names a module of the encoder (as peft matches them: the whole name or
    its last parts); peft's own refusal is a traceback that names no config key."""
    import torch

    names = [name for name, _ in model.named_modules()]
    missing = [t for t in targets if not any(n == t or n.endswith(f".{t}") for n in names)]
    if missing:
        prefix = f"{model.base_model_prefix}."
        linear = {
            n.rsplit(".", 1)[-1]
            for n, m in model.named_modules()
            if n.startswith(prefix) and isinstance(m, torch.nn.Linear)
        }
        raise ConfigError(
            f"peers.lora.target_modules: {missing} name no module of the encoder; "
            f"its linear layers: {', '.join(sorted(linear))}"
        )


def bitfit(model):
    """Every bias of the encoder and the whole task head trained; every other weight frozen."""
    prefix = f"{model.base_model_prefix}."
    for name, param in model.named_parameters():
        param.requires_grad = name.endswith(".bias") or not name.startswith(prefix)
    return model


def trainable_parameters(model) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
