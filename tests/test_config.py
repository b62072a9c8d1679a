"""The config tree composes for every experiment x method, and typos fail at compose time."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra.errors import ConfigCompositionException
from omegaconf.errors import ConfigKeyError, ValidationError

from tests.conftest import CONF, compose

EXPERIMENTS = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))
PEFTS = sorted(p.stem for p in (CONF / "peft").glob("*.yaml"))


def test_groups_exist() -> None:
    assert {"full", "lora", "prompt_tuning", "ia3", "none"} <= set(PEFTS)
    for group in (
        "dataset",
        "shift",
        "model",
        "peft",
        "metric",
        "trainer",
        "logger",
        "callbacks",
        "paths",
        "experiment",
        "debug",
        "hydra",
        "task",
    ):
        assert (CONF / group).is_dir(), group


@pytest.mark.parametrize("peft", PEFTS)
@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_experiment_composes_with_every_method(experiment: str, peft: str) -> None:
    cfg = compose([f"+experiment={experiment}", f"peft={peft}"])
    assert cfg.peft.name == peft
    choices = cfg.hydra.runtime.choices
    # A synthetic preset names its shift (transform shifts append their level); a real
    # dataset's experiment sets its shift on a generic kind and names it after itself.
    assert cfg.shift.name.startswith(choices.shift) or cfg.shift.name == experiment
    assert experiment.startswith(choices.dataset.split("_")[0])
    assert cfg.task.name == "train_eval"


def test_debug_smoke_shrinks_the_run() -> None:
    cfg = compose(["debug=smoke"])
    assert cfg.trainer.max_steps == 3
    assert cfg.data.batch_size == 4  # debug overrides the primary config
    assert cfg.data.limit.train == 32 and cfg.data.limit.test_ood == 12


@pytest.mark.parametrize(
    "override",
    [
        "shift.ood_valuez=[ct]",  # misspelled key in a typed group
        "peft.lrr=0.1",
        "trainer.max_epoch=1",
        "model.max_new_token=3",
        "seeed=1",
        "dataset.n_case=10",
    ],
)
def test_misspelled_key_is_rejected(override: str) -> None:
    with pytest.raises((ConfigCompositionException, ConfigKeyError, ValidationError)) as err:
        compose([override])
    key = override.split("=")[0].lstrip("+").split(".")[-1]
    assert key in str(err.value) or key in str(err.value.__cause__)


def test_misspelled_dataset_key_is_rejected_for_real_datasets() -> None:
    with pytest.raises((ConfigCompositionException, ConfigKeyError, ValidationError)) as err:
        compose(["+experiment=slake_modality", "dataset.clean_closd=false"])
    assert "clean_closd" in str(err.value) + str(err.value.__cause__)


def test_misspelled_key_in_a_yaml_file_is_rejected(tmp_path: Path) -> None:
    """A user's own shift file with a typo fails at compose time, naming the key."""
    (tmp_path / "shift").mkdir()
    (tmp_path / "shift" / "typo.yaml").write_text(
        "defaults:\n  - shift_schema\n  - _self_\nname: typo\nfield: modality\n"
        "ood_valuez: [x-ray]\n"
    )
    with pytest.raises(ConfigCompositionException) as err:
        compose([f"hydra.searchpath=[file://{tmp_path}]", "shift=typo"])
    assert "ood_valuez" in str(err.value) + str(err.value.__cause__)


def test_wrong_type_is_rejected() -> None:
    with pytest.raises((ConfigCompositionException, ValidationError)):
        compose(["peft.lr=fast"])


def test_unknown_choice_names_the_options() -> None:
    with pytest.raises(ConfigCompositionException) as err:
        compose(["peft=lorra"])
    assert "lorra" in str(err.value)
    assert "lora" in str(err.value)  # Hydra lists the available options


def test_task_choice() -> None:
    assert compose(["task=splits"]).task.name == "splits"


SCHEMA_GROUPS = ("dataset", "metric", "shift", "model", "peft", "trainer", "judge", "paths")


def test_no_yaml_restates_a_schema_default() -> None:
    """Every default is written once: in the schema (for plug-ins: the class's signature).

    A YAML file of a group sets only what differs from its schema, so a default changed in
    the code cannot be silently overridden by a stale copy in some YAML file.
    """
    import yaml
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    import medvqa.config  # noqa: F401

    repo = ConfigStore.instance().repo

    def inherited(group: str, entries: list) -> dict:
        """What a file's defaults list gives it: its schema, or another option of its group."""
        values: dict = {}
        for entry in entries:
            if entry == "_self_":
                continue
            if str(entry).endswith("_schema"):
                node = repo[group][f"{entry}.yaml"].node
                values.update(OmegaConf.to_container(node, resolve=False))
            else:  # a preset built on a generic option (e.g. shift/age.yaml on shift/range.yaml)
                raw = yaml.safe_load((CONF / group / f"{entry}.yaml").read_text())
                values.update(inherited(group, raw.pop("defaults", [])))
                values.update(raw)
        return values

    restated = []
    for group in SCHEMA_GROUPS:
        for path in sorted((CONF / group).glob("*.yaml")):
            raw = yaml.safe_load(path.read_text()) or {}
            defaults = inherited(group, raw.pop("defaults", []))
            assert defaults, f"{path} does not start from its group's schema"
            restated += [
                f"{path.name}:{k}" for k, v in raw.items() if defaults.get(k, object()) == v
            ]
    assert not restated, f"YAML keys equal to their schema default (delete them): {restated}"
