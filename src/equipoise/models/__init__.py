"""Model zoo: ``build_model(name, input_shape, num_classes)`` for the built-in
models (MODELS) or a user ``package.module:function`` spec."""

from equipoise.models.registry import MODELS, ModelError, build_model, model_from_spec

__all__ = ["MODELS", "ModelError", "build_model", "model_from_spec"]
