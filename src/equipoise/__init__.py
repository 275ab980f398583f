"""equipoise: parameter-server training for PyTorch on unequal and shared clusters.

    import equipoise
    summary = equipoise.train({"protocol": "bsp", "workers": 4, "servers": 2})
"""

from .config import Config, ConfigError, EquipoiseWarning

__version__ = "0.1.0"
__all__ = ["Config", "ConfigError", "EquipoiseWarning", "control", "resolve_config", "simulate", "train",
           "__version__"]


def __getattr__(name: str):
    # The API pulls in the runtime, data and models; server and worker processes import
    # `equipoise.config` without paying for all of that.
    if name in ("train", "resolve_config", "control"):
        from . import api
        return getattr(api, name)
    if name == "simulate":
        from .sim import simulate
        return simulate
    raise AttributeError(f"module 'equipoise' has no attribute {name!r}")
