"""equipoise: parameter-server training for PyTorch on unequal and shared clusters.

    import equipoise
    summary = equipoise.train({"protocol": "bsp", "workers": 4, "servers": 2})
"""

from .api import resolve_config, train
from .config import Config, ConfigError

__version__ = "0.1.0"
__all__ = ["Config", "ConfigError", "resolve_config", "train", "__version__"]
