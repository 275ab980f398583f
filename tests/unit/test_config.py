import pytest

from equipoise.config import Config, ConfigError, parse_override, read_toml, to_toml


def test_defaults_are_the_default_job():
    c = Config()
    assert (c.protocol, c.workers, c.servers, c.model, c.dataset) == ("bsp", 4, 2, "cnn", "fashion-mnist")
    assert c.total_iterations(60000) == 469  # one epoch at batch 128


def test_the_default_job_is_examples_default_toml_and_torch_defaults_elsewhere():
    """A key PyTorch also has takes PyTorch's default (momentum 0, as torch.optim.SGD);
    the default job (no config given) sets its own 0.9, which examples/default.toml
    writes out: the two are one job."""
    from pathlib import Path

    from equipoise.api import resolve_config

    assert Config().momentum == 0.0
    default = resolve_config()
    assert default.momentum == 0.9 and resolve_config(workers=2).momentum == 0.9
    example = Path(__file__).resolve().parents[2] / "examples" / "default.toml"
    assert Config.load(example) == default
    assert "momentum 0.9" in default.optimizer_line() and "no clipping" in default.optimizer_line()


def test_toml_then_overrides(tmp_path):
    f = tmp_path / "job.toml"
    f.write_text('protocol = "asp"\nworkers = 3\nlr = 0.1\n')
    c = Config.load(f, {"workers": 2})
    assert (c.protocol, c.workers, c.lr) == ("asp", 2, 0.1)


def test_written_config_reads_back_identical(tmp_path):
    c = Config.from_dict({"slowdown": [1, 1, 2, 4], "batch_split": [32, 32, 32, 32], "data_dir": 'a "b"'})
    f = tmp_path / "c.toml"
    f.write_text(to_toml(c.to_dict()))
    assert Config.load(f) == c


@pytest.mark.parametrize("item, expected", [
    ("lr=0.1", ("lr", 0.1)), ("protocol=asp", ("protocol", "asp")),
    ("slowdown=[1,2]", ("slowdown", [1, 2])), ('data_dir="/x y"', ("data_dir", "/x y")),
    ("progress=false", ("progress", False)),
])
def test_parse_override(item, expected):
    assert parse_override(item) == expected


@pytest.mark.parametrize("values, words", [
    ({"protocol": "foo"}, ["protocol", "'foo'"]),
    ({"auth": "none"}, ["auth", "'none'", "curve", "plain", "off"]),
    ({"global_batch": 0}, ["global_batch", "0"]),
    ({"workers": 9, "global_batch": 8}, ["workers", "9", "global_batch"]),
    ({"lr": -1.0}, ["lr", "-1.0"]),
    ({"lr": float("nan")}, ["lr"]),
    ({"workers": 2.5}, ["workers", "2.5"]),
    ({"workers": True}, ["workers", "True"]),
    ({"batch_split": [1, 2]}, ["batch_split", "workers"]),
    ({"batch_split": [10, 10, 10, 10]}, ["batch_split", "global_batch"]),
    ({"batch_split": [-1, 65, 32, 32]}, ["batch_split", "≥ 0"]),
    ({"batch_split": [0, 64, 32, 32], "protocol": "asp"}, ["batch_split", "no samples", "asp"]),
    ({"min_batch": -1}, ["min_batch", "-1"]),
    ({"slowdown": [1, 1, 1, 0.5]}, ["slowdown"]),
    ({"slowdown_noise": 1.5}, ["slowdown_noise", "1.5"]),
    ({"slowdown_noise": float("nan")}, ["slowdown_noise"]),
    ({"model": "nonsense"}, ["model", "nonsense"]),
    ({"max_batch": 10}, ["max_batch", "10"]),
    ({"block_size": -1}, ["block_size", "-1"]),
    ({"psld_horizon": 0}, ["psld_horizon", "0"]),
    ({"fragment_kb": -1}, ["fragment_kb", "-1"]),
    ({"colour": "red"}, ["colour"]),
    ({"eager_update": True, "backward_push": True}, ["eager_update", "forward_pull = false"]),
    ({"eager_update": True, "backward_push": True, "forward_pull": True, "protocol": "asp"},
     ["eager_update", "'asp'"]),
])
def test_bad_values_name_key_and_value(values, words):
    with pytest.raises(ConfigError) as info:
        Config.from_dict(values)
    msg = str(info.value)
    assert "\n" not in msg
    for w in words:
        assert w in msg


def test_bad_toml_names_file(tmp_path):
    f = tmp_path / "bad.toml"
    f.write_text("lr = = 1")
    with pytest.raises(ConfigError, match="bad.toml"):
        read_toml(f)


def test_auth_defaults_to_authenticated_and_warns_about_plain_beyond_loopback():
    assert Config().auth == "plain" and not Config().warnings()
    assert any("curve" in w for w in Config(host="*").warnings())
    assert not Config(host="*", auth="curve").warnings() and not Config(host="*", transport="ipc").warnings()


def test_ray_keys_are_checked_and_survive_toml():
    import tomllib

    cfg = Config.from_dict({"launcher": "ray", "worker_resources": {"CPU": 2, "fast": 1}})
    assert cfg.worker_resources == {"CPU": 2.0, "fast": 1.0} and cfg.server_resources == {"CPU": 1.0}
    assert Config.from_dict(tomllib.loads(to_toml(cfg.to_dict()))) == cfg
    for bad, match in [({"worker_resources": {"CPU": -1}}, "worker_resources"),
                       ({"server_resources": 3}, "server_resources"),
                       ({"launcher": "k8s"}, "launcher"),
                       ({"ray_strategy": "spread"}, "ray_strategy"),
                       ({"launcher": "ray", "cpu_limit": [1.0] * 4}, "cpu_limit"),
                       ({"launcher": "ray", "transport": "ipc"}, "transport")]:
        with pytest.raises(ConfigError, match=match):
            Config.from_dict(bad)


def test_resources_may_be_given_per_rank_and_server_speeds_inform_the_oracle():
    """A list places each rank by its own table (a server behind a host's slow link);
    ranks beyond it (a replacement worker, an added server) take the last table."""
    import tomllib

    per_rank = [{"CPU": 0.5, "h1": 1}, {"CPU": 0.5, "h2": 1}]
    cfg = Config.from_dict({"launcher": "ray", "servers": 2, "server_resources": per_rank,
                            "server_speeds": [1, 0.25]})
    assert [cfg.resources("server", r) for r in (0, 1, 2)] == [{"CPU": 0.5, "h1": 1.0}, {"CPU": 0.5, "h2": 1.0},
                                                                {"CPU": 0.5, "h2": 1.0}]
    assert cfg.resources("worker", 7) == {"CPU": 1.0}
    assert Config.from_dict(tomllib.loads(to_toml(cfg.to_dict()))) == cfg
    for bad, match in [({"servers": 3, "server_resources": per_rank}, "lists 2 tables for 3 servers"),
                       ({"workers": 4, "worker_resources": []}, "lists no table"),
                       ({"servers": 2, "server_resources": [{"CPU": 1}, {"CPU": -1}]}, r"server_resources\[1\]"),
                       ({"servers": 2, "server_speeds": [1.0, 0.0]}, "server_speeds")]:
        with pytest.raises(ConfigError, match=match):
            Config.from_dict(bad)
    from equipoise.coordinator.server_manager import ServerManager, ServerSettings

    tensors = [(name, 40, "param", 4) for name in "abcde"]  # five equal blocks
    counts = []
    for speeds in ([1.0, 0.25], []):  # the oracle's makespan: 4 blocks at 1 against 1 at 1/4
        manager = object.__new__(ServerManager)
        manager.settings = cfg.replace(placement="oracle", server_speeds=speeds).slice(ServerSettings)
        blocks, table = manager.place(tensors)
        counts.append(sorted(table[b.key] for b in blocks).count(1))
    assert counts[0] == 1 and counts[1] in (2, 3)



@pytest.mark.parametrize("key, hint", [("clip", "clip_grad_norm"), ("momentom", "momentum"), ("zzz", None)])
def test_an_unknown_key_names_the_keys_it_may_have_meant(key, hint):
    with pytest.raises(ConfigError) as exc:
        Config.from_dict({key: 1})
    message = str(exc.value)
    assert f"unknown config key {key!r}" in message and "\n" not in message
    assert (f"did you mean {hint}" in message) if hint else "did you mean" not in message
