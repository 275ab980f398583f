"""Unit tests for equipoise.models: built-in model shapes and purity, and the
``package.module:function`` user-spec path."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

from equipoise.models import MODELS, ModelError, build_model, model_from_spec

USER_MODULE = '''
from torch import nn


def with_both(input_shape, num_classes):
    channels, height, width = input_shape
    return nn.Sequential(nn.Flatten(), nn.Linear(channels * height * width, num_classes))


def classes_only(*, num_classes):
    return nn.Sequential(nn.Flatten(), nn.LazyLinear(num_classes))


def no_arguments():
    return nn.Sequential(nn.Flatten(), nn.Linear(4, 3))


def takes_kwargs(**kwargs):
    return nn.Linear(kwargs["input_shape"][0], kwargs["num_classes"])


def not_a_module(input_shape, num_classes):
    return "a string"


def raises(input_shape, num_classes):
    raise RuntimeError("boom\\non two lines")


class Holder:
    @staticmethod
    def build(num_classes):
        return nn.Linear(2, num_classes)


CONSTANT = 3
'''


@pytest.fixture
def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A throwaway importable package ``equipoise_user_models_test.zoo``."""
    package = tmp_path / "equipoise_user_models_test"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "zoo.py").write_text(textwrap.dedent(USER_MODULE))
    (package / "broken.py").write_text("import a_module_that_does_not_exist_anywhere\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "equipoise_user_models_test"
    for name in [m for m in sys.modules if m.startswith("equipoise_user_models_test")]:
        del sys.modules[name]


@pytest.mark.parametrize(
    ("name", "shape"),
    [
        ("mlp", (1, 28, 28)),
        ("mlp", (3, 32, 32)),
        ("mlp-deep", (1, 28, 28)),
        ("cnn", (1, 28, 28)),
        ("cnn", (3, 32, 32)),
        ("cnn", (1, 8, 8)),
        ("cnn", (2, 9, 13)),
        ("resnet20", (3, 32, 32)),
        ("resnet20", (1, 28, 28)),
    ],
)
def test_builtin_output_shape(name: str, shape: tuple[int, int, int]) -> None:
    torch.manual_seed(0)
    model = build_model(name, shape, 7)
    assert isinstance(model, nn.Module)
    out = model(torch.randn(3, *shape))
    assert out.shape == (3, 7) and out.dtype == torch.float32


def test_mlp_and_cnn_layers() -> None:
    mlp = build_model("mlp", (1, 28, 28), 10)
    linears = [m for m in mlp.modules() if isinstance(m, nn.Linear)]
    assert [(l.in_features, l.out_features) for l in linears] == [(784, 256), (256, 10)]
    deep = build_model("mlp-deep", (1, 28, 28), 10)
    linears = [m for m in deep.modules() if isinstance(m, nn.Linear)]
    assert [(l.in_features, l.out_features) for l in linears] == [(784, 512), (512, 512), (512, 512), (512, 10)]
    cnn = build_model("cnn", (1, 28, 28), 10)
    forbidden = (nn.modules.batchnorm._BatchNorm, nn.Dropout, nn.GroupNorm, nn.LayerNorm)
    assert not any(isinstance(m, forbidden) for m in cnn.modules())


@pytest.mark.parametrize("name", ["mlp", "mlp-deep", "cnn"])
def test_pure_models_are_batch_independent(name: str) -> None:
    """Per-sample outputs don't depend on what else is in the batch (no BN/dropout)."""
    torch.manual_seed(1)
    model = build_model(name, (1, 28, 28), 10)
    model.train()
    x = torch.randn(6, 1, 28, 28)
    together = model(x)
    apart = torch.cat([model(x[:2]), model(x[2:])])
    assert torch.allclose(together, apart, atol=1e-5)


def test_seeding_makes_models_identical() -> None:
    for name in MODELS:
        torch.manual_seed(42)
        first = build_model(name, (3, 32, 32), 10)
        torch.manual_seed(42)
        second = build_model(name, (3, 32, 32), 10)
        for a, b in zip(first.parameters(), second.parameters()):
            assert torch.equal(a, b)


def test_resnet20_structure() -> None:
    model = build_model("resnet20", (3, 32, 32), 10)
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    assert len(convs) == 19  # 1 + 3 stages x 3 blocks x 2 convs; + fc = 20 layers
    assert any(isinstance(m, nn.BatchNorm2d) for m in model.modules())
    assert 265_000 < sum(p.numel() for p in model.parameters()) < 275_000


def test_user_spec_passes_accepted_kwargs(user_module: str) -> None:
    zoo = f"{user_module}.zoo"
    model = build_model(f"{zoo}:with_both", (2, 3, 4), 5)
    assert model(torch.randn(1, 2, 3, 4)).shape == (1, 5)
    lazy = build_model(f"{zoo}:classes_only", (1, 2, 2), 6)
    assert lazy(torch.randn(2, 1, 2, 2)).shape == (2, 6)
    assert isinstance(build_model(f"{zoo}:no_arguments", (1, 2, 2), 3), nn.Sequential)
    assert build_model(f"{zoo}:takes_kwargs", (4, 1, 1), 2).out_features == 2
    assert model_from_spec(f"{zoo}:Holder.build", (1, 1, 1), 9).out_features == 9


@pytest.mark.parametrize(
    ("suffix", "fragment"),
    [
        ("zoo:not_a_module", "returned str, not a torch.nn.Module"),
        ("zoo:raises", "call raised RuntimeError: boom on two lines"),
        ("zoo:missing", "has no attribute 'missing'"),
        ("zoo:CONSTANT", "is not callable"),
        ("broken:anything", "ModuleNotFoundError: No module named 'a_module_that_does_not_exist_anywhere'"),
        ("nosuchmodule:f", "cannot import"),
        ("zoo:", "expected 'package.module:function'"),
    ],
)
def test_bad_user_specs(user_module: str, suffix: str, fragment: str) -> None:
    spec = f"{user_module}.{suffix}"
    with pytest.raises(ModelError, match=fragment) as info:
        build_model(spec, (1, 4, 4), 3)
    message = str(info.value)
    assert spec in message and "\n" not in message


@pytest.mark.parametrize(
    ("name", "shape", "classes", "fragment"),
    [
        ("vgg16", (1, 28, 28), 10, "unknown model 'vgg16'.*resnet20"),
        (":fn", (1, 28, 28), 10, "expected 'package.module:function'"),
        ("mlp", (28, 28), 10, "three positive ints"),
        ("mlp", (1, 0, 28), 10, "three positive ints"),
        ("mlp", (1, 28, 28), 0, "num_classes"),
        ("cnn", (1, 3, 28), 10, "H, W >= 4"),
    ],
)
def test_bad_names_and_shapes(name, shape, classes, fragment) -> None:
    with pytest.raises(ModelError, match=fragment) as info:
        build_model(name, shape, classes)
    assert "\n" not in str(info.value)
    assert issubclass(ModelError, ValueError)
