"""PEFT adapters (LoRA, ...): everything cadence knows about ``peft`` is here, imported lazily.

A model with adapters is either a ``peft.PeftModel`` or a ``transformers`` model given adapters by
its own integration (``model.add_adapter(...)``, which sets ``_hf_peft_config_loaded``). For both:

- only the adapter parameters require grad, so only they reach the optimizer (frozen parameters
  never do, see ``optimization.get_parameter_groups``);
- ``save_pretrained`` writes the adapter only (``adapter_model.safetensors`` + ``adapter_config.json``;
  an adapter not named ``default`` in a subfolder of its name), never the frozen base: that is what
  checkpoints and ``save_model`` hold;
- :func:`load_adapter_weights` puts such a folder back into the model in place (resume,
  ``load_best_model_at_end``): the same tensors, so the optimizer's references stay valid.

A model whose weights are quantized (bitsandbytes 4/8-bit) and that has no adapter cannot be
trained: :func:`refuse_quantized_without_adapters` refuses it before the first step, as transformers does.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from torch import nn

ADAPTER_WEIGHTS_NAME = "adapter_model.safetensors"
ADAPTER_CONFIG_NAME = "adapter_config.json"
_QUANTIZED_FLAGS = ("is_quantized", "is_loaded_in_4bit", "is_loaded_in_8bit")


def has_adapters(model: nn.Module) -> bool:
    """True for a ``peft.PeftModel`` or a ``transformers`` model with adapters loaded.

    ``peft`` is not imported here: a ``PeftModel`` cannot exist unless it already was.
    """
    peft = sys.modules.get("peft")
    if peft is not None and isinstance(model, peft.PeftModel):
        return True
    return bool(getattr(model, "_hf_peft_config_loaded", False))


def refuse_quantized_without_adapters(model: nn.Module) -> None:
    """Refuse a quantized model without adapters (its 4/8-bit weights take no gradient step).

    Raises:
        ValueError: ``is_quantized``/``is_loaded_in_4bit``/``is_loaded_in_8bit`` is set, the model
            has no adapter, and its quantization method does not train (``hf_quantizer.is_qat_trainable``).
    """
    if has_adapters(model) or not any(getattr(model, flag, False) is True for flag in _QUANTIZED_FLAGS):
        return
    if getattr(getattr(model, "hf_quantizer", None), "is_qat_trainable", False):
        return
    raise ValueError(
        f"{type(model).__name__} is purely quantized (loaded in 4-bit or 8-bit, with no adapter), and quantized "
        "weights cannot be fine-tuned directly: attach trainable adapters on top of it first, e.g. "
        "`model = peft.get_peft_model(model, peft.LoraConfig(...))` (see https://huggingface.co/docs/transformers/peft)"
    )


def _require_peft():
    try:
        import peft
    except ImportError as e:  # an adapter model without peft importable: should not happen, say what to install
        raise ImportError("loading adapter weights needs peft: pip install 'cadence[peft]' (or pip install peft)") from e
    return peft


def adapter_folders(model: nn.Module, folder: str | Path) -> dict[str, Path]:
    """Where ``save_pretrained`` put each adapter of ``model`` in ``folder``: a ``PeftModel`` puts ``default`` at
    the top and the others in subfolders named after them; a ``transformers`` model its active adapter at the top."""
    folder = Path(folder)
    peft = sys.modules.get("peft")
    if peft is not None and isinstance(model, peft.PeftModel):
        return {name: folder if name == "default" else folder / name for name in model.peft_config}
    return {model.active_adapters()[0]: folder}


def load_adapter_weights(model: nn.Module, folder: str | Path) -> None:
    """Load the adapters ``save_pretrained`` wrote into ``folder`` back into ``model``, in place.

    Every adapter of the model must be there with exactly its tensors (no missing or unexpected
    key), so a resumed or best model is the saved one.

    Raises:
        FileNotFoundError: an adapter's ``adapter_model.safetensors`` is missing.
        ValueError: the saved adapter does not fit the model's.
    """
    peft = _require_peft()
    from safetensors.torch import load_file

    device = str(next((p.device for p in model.parameters()), "cpu"))
    for name, path in adapter_folders(model, folder).items():
        weights = path / ADAPTER_WEIGHTS_NAME
        if not weights.is_file():
            raise FileNotFoundError(
                f"checkpoint {folder} has no {weights.relative_to(folder)} for adapter {name!r} of {type(model).__name__}: "
                "resume from a checkpoint written by the same adapter model"
            )
        state = load_file(str(weights), device=device)
        expected = set(peft.get_peft_model_state_dict(model, adapter_name=name))
        missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
        if missing or unexpected:
            raise ValueError(
                f"the adapter {name!r} in {path} does not fit {type(model).__name__}: missing {missing[:5]}, unexpected "
                f"{unexpected[:5]}; resume with the same adapter configuration the checkpoint was written with"
            )
        peft.set_peft_model_state_dict(model, state, adapter_name=name)
