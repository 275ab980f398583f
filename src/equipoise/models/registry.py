"""Building a model from a name or a user ``package.module:function`` spec."""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping
from typing import Any

from torch import nn

from equipoise.spec import accepted_kwargs, resolve
from equipoise.models.zoo import build_cnn, build_mlp, build_mlp_deep, build_resnet20

MODELS = ("mlp", "mlp-deep", "cnn", "resnet20")
BUILDERS: dict[str, Callable[[tuple[int, int, int], int], nn.Module]] = {
    "mlp": build_mlp,
    "mlp-deep": build_mlp_deep,
    "cnn": build_cnn,
    "resnet20": build_resnet20,
}
USER_KWARGS = ("input_shape", "num_classes")


class ModelError(ValueError):
    """A model could not be built; the one-line message names the model spec."""


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


def _check_shape(spec: str, input_shape: tuple[int, int, int], num_classes: int) -> tuple[int, int, int]:
    """``input_shape`` as a tuple of three positive ints; ModelError otherwise."""
    try:
        shape = tuple(operator.index(v) for v in input_shape)
        classes = operator.index(num_classes)
    except TypeError as exc:
        raise ModelError(f"model {spec!r}: input_shape and num_classes must be ints: {_one_line(exc)}") from exc
    if len(shape) != 3 or min(shape) <= 0:
        raise ModelError(f"model {spec!r}: input_shape must be three positive ints (C, H, W), got {shape}")
    if classes < 1:
        raise ModelError(f"model {spec!r}: num_classes must be positive, got {classes}")
    return shape  # type: ignore[return-value]


def _resolve(spec: str) -> Callable[..., object]:
    return resolve(spec, "model", ModelError)


def model_from_spec(spec: str, input_shape: tuple[int, int, int], num_classes: int,
                    args: Mapping[str, Any] | None = None) -> nn.Module:
    """Import ``package.module`` from ``spec`` = ``"package.module:function"`` and
    call ``function``, passing ``input_shape=`` and ``num_classes=`` only as far as
    its signature accepts them, and every keyword of ``args`` (the config's
    ``model_args``). The result must be an ``nn.Module``; any failure (import, lookup,
    the call raising, a non-module result) is a ModelError."""
    function = _resolve(spec)
    offered = {"input_shape": None if input_shape is None else tuple(input_shape), "num_classes": num_classes}
    kwargs = {**accepted_kwargs(function, {k: v for k, v in offered.items() if v is not None}), **(args or {})}
    try:
        model = function(**kwargs)
    except Exception as exc:
        raise ModelError(f"model spec {spec!r}: call raised {type(exc).__name__}: {_one_line(exc)}") from exc
    if not isinstance(model, nn.Module):
        raise ModelError(f"model spec {spec!r}: returned {type(model).__name__}, not a torch.nn.Module")
    return model


def build_model(name: str, input_shape: tuple[int, int, int] | None, num_classes: int | None,
                args: Mapping[str, Any] | None = None) -> nn.Module:
    """A freshly initialised model: one of MODELS, or a ``package.module:function``
    spec (see ``model_from_spec``). Parameters get PyTorch's default
    initialisation from the global RNG, so seed torch first for reproducibility.
    A dataset that declares no ``input_shape``/``num_classes`` (a language model's, a
    regression's) passes None: a spec is then called without them, and a built-in model
    (which needs both) is refused. Unknown names, bad shapes and failing specs raise
    ModelError."""
    if ":" in name:
        if input_shape is not None and num_classes is not None:
            input_shape = _check_shape(name, input_shape, num_classes)
            num_classes = operator.index(num_classes)
        return model_from_spec(name, input_shape, num_classes, args)
    if args:
        raise ModelError(f"model_args {sorted(args)} are for a model spec; {name!r} is built in")
    builder = BUILDERS.get(name)
    if builder is None:
        raise ModelError(
            f"unknown model {name!r}; choose one of {', '.join(MODELS)} or 'package.module:function'"
        )
    if input_shape is None or num_classes is None:
        raise ModelError(f"model {name!r} needs a dataset that declares input_shape and num_classes "
                         "(attributes of its training Dataset); give your own model as 'file.py:function'")
    shape = _check_shape(name, input_shape, num_classes)
    try:
        return builder(shape, operator.index(num_classes))
    except ValueError as exc:
        raise ModelError(f"model {name!r}: {_one_line(exc)}") from exc
