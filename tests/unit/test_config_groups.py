"""Configuration in groups: every key in one group, tables as the canonical spelling, and
every spelling of earlier versions (flat keys, flat `--set`, the old table aliases) still
giving the same job."""

import dataclasses
import tomllib
from pathlib import Path

import pytest
import torch

from equipoise.config import Config, ConfigError, GROUPS, parse_override
from equipoise.config_checks import CHECKS

FLAT = Path(__file__).parent / "data" / "flat_config_f9fde5b.toml"


def test_every_key_is_in_exactly_one_group_and_every_group_is_checked():
    owners: dict[str, list[str]] = {}
    for group, table in GROUPS.items():
        for flat in table.values():
            owners.setdefault(flat, []).append(group)
    names = [f.name for f in dataclasses.fields(Config)]
    assert sorted(owners) == sorted(names)
    assert all(len(g) == 1 for g in owners.values()), {k: g for k, g in owners.items() if len(g) > 1}
    assert list(CHECKS) == list(GROUPS)
    # what no production job sets is apart from the rest
    assert all(k.startswith("sim_") for k in GROUPS["sim"].values())
    assert {"slowdown", "server_slowdown", "neighbours", "cpu_limit"} <= set(GROUPS["emulation"].values())


def test_a_group_is_a_frozen_dataclass_of_its_keys():
    cfg = Config.from_dict({"optimizer": "adamw", "lr": 0.01})
    opt = cfg.group("optimizer")
    assert (opt.optimizer, opt.lr) == ("adamw", 0.01)
    assert {f.name for f in dataclasses.fields(opt)} == set(GROUPS["optimizer"].values())
    with pytest.raises(dataclasses.FrozenInstanceError):
        opt.lr = 1.0
    with pytest.raises(KeyError, match="no config group 'optimiser'"):
        cfg.group("optimiser")


def test_a_flat_file_from_before_the_groups_loads_the_same_config_as_its_tables():
    old = Config.load(FLAT)
    written = old.to_toml()
    assert "[optimizer]" in written and "\nlr = 0.01\n" in written
    assert not any(line.startswith("lr =") for line in written.splitlines()[:1])  # nothing flat at the top
    new = Config.from_dict(tomllib.loads(written))
    assert new == old
    assert new.to_toml() == written


def test_set_in_flat_and_dotted_spellings_gives_the_same_config():
    flat = ["optimizer=adamw", "lr=0.02", "servers=3", "eval_every=7", "sim_noise=0.1", "server_slowdown=[1.0, 2.0, 1.0]"]
    dotted = ["optimizer.name=adamw", "optimizer.lr=0.02", "servers.count=3", "eval.every=7", "sim.noise=0.1",
              "emulation.server_slowdown=[1.0, 2.0, 1.0]"]
    a = Config.load(FLAT, dict(parse_override(s) for s in flat))
    b = Config.load(FLAT, dict(parse_override(s) for s in dotted))
    assert a == b
    assert (a.optimizer, a.lr, a.servers, a.eval_every, a.sim_noise) == ("adamw", 0.02, 3, 7, 0.1)


def test_the_old_table_aliases_still_read(tmp_path):
    f = tmp_path / "old.toml"
    f.write_text('[servers]\ncount = 2\nslowdown = [1.0, 3.0]\nrate = 500.0\n[data]\nname = "digits"\n')
    cfg = Config.load(f)
    assert (cfg.servers, cfg.server_slowdown, cfg.server_rate, cfg.dataset) == (2, (1.0, 3.0), 500.0, "digits")


def test_a_key_given_twice_or_unknown_in_its_table_is_refused_by_name(tmp_path):
    with pytest.raises(ConfigError, match="lr is given twice: as optimizer.lr and as a key on its own"):
        Config.from_dict({"optimizer": {"lr": 0.1}, "lr": 0.2})
    with pytest.raises(ConfigError, match="unknown key 'lrr' in \\[optimizer\\]"):
        Config.from_dict({"optimizer.lrr": 0.1})
    # a group's name is still a flat key where it was one
    assert Config.from_dict({"optimizer": "adam"}).optimizer == "adam"


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_flat_file_and_its_tables_train_the_same_job_bit_for_bit(tmp_path):
    """Equal configs are the argument; the job run from each spelling is the check."""
    from equipoise.data import load_dataset
    from equipoise.launch.threads import run_threads

    data = load_dataset("digits")
    tables = tmp_path / "tables.toml"
    tables.write_text(Config.load(FLAT).to_toml())
    finals = []
    for name, cfg in (("flat", Config.load(FLAT)), ("tables", Config.load(tables))):
        (tmp_path / name).mkdir()
        run_threads(cfg, tmp_path / name, data)
        finals.append(torch.load(tmp_path / name / "model.pt", weights_only=True))
    assert finals[0].keys() == finals[1].keys()
    assert all(torch.equal(finals[0][k], finals[1][k]) for k in finals[0])


def test_the_groups_table_of_the_docs_lists_every_groups_keys():
    doc = (Path(__file__).parents[2] / "docs" / "configuration.md").read_text()
    for group, table in GROUPS.items():
        row = next((line for line in doc.splitlines() if line.startswith(f"| `[{group}]` |")), None)
        assert row is not None, group
        if group != "sim":
            for sub, flat in table.items():
                assert (f"`{sub}`" if sub == flat else f"`{sub}` → `{flat}`") in row, (group, sub)
