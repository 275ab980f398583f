"""Datasets held in memory, and the global sample order shared by workers.

``load_dataset(name)`` returns a :class:`Dataset`; :class:`SliceSampler` turns
(iteration, offset, size) into the sample indices a worker trains on.
"""

from equipoise.data.dataset import ArraySplit, DataError, Dataset
from equipoise.data.load import DATASETS, DEFAULT_DIRS, load_dataset
from equipoise.data.sampler import SliceSampler

__all__ = ["ArraySplit", "DATASETS", "DEFAULT_DIRS", "DataError", "Dataset", "SliceSampler", "load_dataset"]
