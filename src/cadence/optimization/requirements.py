"""Requirements: the package each optimizer needs beyond torch, and the error naming its pip command."""


from __future__ import annotations

import importlib.util
import sys


# optim names built on bitsandbytes' optimizers
_BITSANDBYTES = (
    "adamw_bnb_8bit", "adamw_8bit", "paged_adamw_32bit", "paged_adamw_8bit",
    "ademamix", "ademamix_8bit", "paged_ademamix_32bit", "paged_ademamix_8bit",
    "lion_32bit", "lion_8bit", "paged_lion_32bit", "paged_lion_8bit",
    "rmsprop_bnb", "rmsprop_bnb_8bit", "rmsprop_bnb_32bit",
)  # fmt: skip


# Optimizers that need a package torch does not ship: optim name -> (import name, pip command).
_OPTIONAL_PACKAGES: dict[str, tuple[str, str]] = {
    **dict.fromkeys(_BITSANDBYTES, ("bitsandbytes", "pip install -U bitsandbytes")),
    "adamw_torch_xla": ("torch_xla", "pip install torch_xla"),
    "adamw_torch_npu_fused": ("torch_npu", "pip install torch_npu"),
    "adamw_anyprecision": ("torchdistx", "pip install git+https://github.com/pytorch/torchdistx"),
    "adamw_torch_4bit": ("torchao", "pip install torchao"),
    "adamw_torch_8bit": ("torchao", "pip install torchao"),
    **dict.fromkeys(
        ("galore_adamw", "galore_adamw_8bit", "galore_adafactor")
        + ("galore_adamw_layerwise", "galore_adamw_8bit_layerwise", "galore_adafactor_layerwise"),
        ("galore_torch", "pip install galore-torch"),
    ),
    "apollo_adamw": ("apollo_torch", "pip install apollo-torch"),
    "apollo_adamw_layerwise": ("apollo_torch", "pip install apollo-torch"),
    "lomo": ("lomo_optim", "pip install lomo-optim"),
    "adalomo": ("lomo_optim", "pip install lomo-optim"),
    "grokadamw": ("grokadamw", "pip install grokadamw"),
    **dict.fromkeys(
        ("schedule_free_radam", "schedule_free_adamw", "schedule_free_sgd"),
        ("schedulefree", "pip install schedulefree"),
    ),
    "stable_adamw": ("optimi", "pip install torch-optimi"),
}


def _package_available(module: str) -> bool:
    if module in sys.modules:  # also honours sys.modules[module] = None, which blocks an import
        return sys.modules[module] is not None
    return importlib.util.find_spec(module) is not None


def _require_package(name: str) -> None:
    module, pip = _OPTIONAL_PACKAGES[name]
    if not _package_available(module):
        raise ValueError(f"optim={name!r} needs the `{module}` package, which is not installed: {pip}")
