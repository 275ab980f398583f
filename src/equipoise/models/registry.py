"""Building a model from a name or a user ``package.module:function`` spec."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import operator
import sys
from pathlib import Path
from collections.abc import Callable

from torch import nn

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
    """The callable named by ``package.module:function`` (dots allowed after the
    colon for nested attributes); ModelError if it cannot be imported or found."""
    module_name, _, attr_path = spec.rpartition(":")
    if not module_name or not attr_path:
        raise ModelError(f"model spec {spec!r}: expected 'package.module:function' or 'path/file.py:function'")
    try:
        target: object = (_import_file(module_name) if module_name.endswith(".py")
                          else importlib.import_module(module_name))
    except Exception as exc:  # an import-time failure of user code of any kind
        raise ModelError(
            f"model spec {spec!r}: cannot import {module_name!r}: {type(exc).__name__}: {_one_line(exc)}"
        ) from exc
    for attr in attr_path.split("."):
        if not hasattr(target, attr):
            raise ModelError(f"model spec {spec!r}: {module_name!r} has no attribute {attr_path!r}")
        target = getattr(target, attr)
    if not callable(target):
        raise ModelError(f"model spec {spec!r}: {attr_path!r} is not callable")
    return target


def _import_file(path: str) -> object:
    """Import a user's script by path, under a name other than ``__main__`` so its
    ``if __name__ == "__main__":`` block does not run again in server or worker processes."""
    file = Path(path).resolve()
    name = f"equipoise_user_{abs(hash(str(file)))}"
    if name in sys.modules:
        return sys.modules[name]
    if not file.is_file():
        raise FileNotFoundError(f"no such file {str(file)!r}")
    module_spec = importlib.util.spec_from_file_location(name, file)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    try:
        module_spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def _accepted_kwargs(function: Callable[..., object], offered: dict[str, object]) -> dict[str, object]:
    """The subset of ``offered`` keyword arguments that ``function`` accepts
    (all of them if it takes ``**kwargs``; none if its signature is unknown)."""
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return {}
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return dict(offered)
    keyword_kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    names = {p.name for p in parameters if p.kind in keyword_kinds}
    return {key: value for key, value in offered.items() if key in names}


def model_from_spec(spec: str, input_shape: tuple[int, int, int], num_classes: int) -> nn.Module:
    """Import ``package.module`` from ``spec`` = ``"package.module:function"`` and
    call ``function``, passing ``input_shape=`` and ``num_classes=`` only as far as
    its signature accepts them. The result must be an ``nn.Module``; any failure
    (import, lookup, the call raising, a non-module result) is a ModelError."""
    function = _resolve(spec)
    kwargs = _accepted_kwargs(function, {"input_shape": tuple(input_shape), "num_classes": num_classes})
    try:
        model = function(**kwargs)
    except Exception as exc:
        raise ModelError(f"model spec {spec!r}: call raised {type(exc).__name__}: {_one_line(exc)}") from exc
    if not isinstance(model, nn.Module):
        raise ModelError(f"model spec {spec!r}: returned {type(model).__name__}, not a torch.nn.Module")
    return model


def build_model(name: str, input_shape: tuple[int, int, int], num_classes: int) -> nn.Module:
    """A freshly initialised model: one of MODELS, or a ``package.module:function``
    spec (see ``model_from_spec``). Parameters get PyTorch's default
    initialisation from the global RNG, so seed torch first for reproducibility.
    Unknown names, bad shapes and failing specs raise ModelError."""
    shape = _check_shape(name, input_shape, num_classes)
    num_classes = operator.index(num_classes)
    if ":" in name:
        return model_from_spec(name, shape, num_classes)
    builder = BUILDERS.get(name)
    if builder is None:
        raise ModelError(
            f"unknown model {name!r}; choose one of {', '.join(MODELS)} or 'package.module:function'"
        )
    try:
        return builder(shape, num_classes)
    except ValueError as exc:
        raise ModelError(f"model {name!r}: {_one_line(exc)}") from exc
