"""The config tree composes for every experiment x method, and typos fail at compose time."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hydra.errors import ConfigCompositionException
from omegaconf.errors import ConfigKeyError, ValidationError

from tests.conftest import CONF, compose, diagonal

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


@pytest.mark.parametrize(("experiment", "peft"), diagonal(EXPERIMENTS, PEFTS))
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


# -- every default once: a YAML value and a medvqa class default never disagree ---------------


def _package(path: Path) -> str:
    """Where a config file lands in the composed config (its `# @package`, else its group)."""
    for line in path.read_text().splitlines():
        if line.startswith("# @package"):
            package = line.split()[-1]
            return "" if package == "_global_" else package
    group = path.parent.relative_to(CONF).as_posix()
    return "" if group == "." else group.replace("/", ".")


def _selection(path: Path) -> list[str] | None:
    """The overrides that compose `path` into the primary config (None: an external node)."""
    rel = path.relative_to(CONF)
    group, option = rel.parent.as_posix(), path.stem
    if group in (".", "hydra"):
        return []
    if group.startswith("hydra/"):
        return None  # launcher plug-ins: hydra-submitit's and Hydra's own classes
    if group.startswith("sweep/"):
        return None  # a grid sweeps include under hydra.sweeper.params: no class reads it
    if group == "experiment":
        return [f"+experiment={option}"]
    if group == "metric":
        return [f"metric=[{option}]"]
    if group.startswith("hparams/"):
        study = group.split("/", 1)[1]
        peft = next(p for p in PEFTS if option.endswith(f"_{p}"))
        return [f"study={study}", f"dataset={option[: -len(peft) - 1]}", f"peft={peft}"]
    # the dataset an option needs (RoboSurg-VQA's neutral question)
    return [f"{group}={option}", *NEEDS.get(rel.as_posix(), [])]


NEEDS = {"baseline/image_only.yaml": ["dataset=robosurg_vqa"]}


def _plain(value: object) -> object:
    from omegaconf import OmegaConf

    if OmegaConf.is_config(value):
        value = OmegaConf.to_container(value, resolve=True)
    return list(value) if isinstance(value, tuple) else value


def _typed_field(target: str, key: str) -> type | None:
    """The dataclass a medvqa class's parameter `key` is annotated with (e.g. the tiny builder's
    `pretrain: Pretrain | ...`): the YAML's mapping there is checked against its fields."""
    import inspect
    import typing

    from hydra.utils import get_object

    obj = get_object(target)
    func = obj.__init__ if inspect.isclass(obj) else obj
    try:
        hint = typing.get_type_hints(func).get(key)
    except Exception:
        return None
    for arg in (*typing.get_args(hint), hint):
        if dataclasses.is_dataclass(arg):
            return arg
    return None


def _default(obj: object, key: str) -> object:
    """`key`'s default in the signature (or dataclass fields) of `obj`; `inspect._empty` if none."""
    import inspect

    if dataclasses.is_dataclass(obj):
        field = {f.name: f for f in dataclasses.fields(obj)}.get(key)
        if field is None or field.default is dataclasses.MISSING:
            return inspect.Parameter.empty
        return field.default
    param = inspect.signature(obj).parameters.get(key)
    return inspect.Parameter.empty if param is None else param.default


def _defines_a_nested_node(node: dict, depth: int) -> bool:
    """Whether a dict `depth` keys or more below the root (2: `model.builder`) writes a
    `_target_`: the only nodes `_disagreements` checks (most option files write none)."""
    return ("_target_" in node and depth >= 2) or any(
        isinstance(value, dict) and _defines_a_nested_node(value, depth + 1)
        for value in node.values()
    )


def _disagreements(path: Path) -> list[tuple[str, str]]:
    """(`<class>.<key>`, what disagrees) for every key `path` sets on a nested node it defines
    for a medvqa class (`model.builder`, `trainer.strategy`, `callbacks.*`: `_target_` written
    there), and on typed fields of it (`model.builder.pretrain`), where the class has a default
    of its own: a different one disagrees, an equal one is a copy. Third-party classes (peft.LoraConfig, lightning.Trainer) may be overridden freely,
    and so may plug-ins, whose schema is their signature."""
    import inspect

    import yaml
    from hydra.core.hydra_config import HydraConfig
    from hydra.utils import get_object
    from omegaconf import DictConfig, OmegaConf

    from medvqa import plugins

    overrides = _selection(path)
    if overrides is None:
        return []
    raw = yaml.safe_load(path.read_text()) or {}
    raw.pop("defaults", None)
    package = _package(path)
    if not _defines_a_nested_node(raw, len(package.split(".")) if package else 0):
        return []  # nothing below checks a key (`home` below): no need to compose
    cfg = compose(overrides)
    HydraConfig.instance().set_config(cfg)  # `${hydra:...}` resolves as in a run
    found = []
    # Plug-ins (datasets, metric families) get their schema from their signature, which holds
    # their only defaults; an option file sets what differs (test_no_yaml_restates_...).
    generated = {c for kind in plugins.GROUPS for c in plugins.registered(kind).values()}

    def check(owner: object, where: str, key: str, value: object) -> None:
        default = _default(owner, key)
        if default is not inspect.Parameter.empty:
            name = f"{owner.__module__}.{owner.__qualname__}.{key}"
            found.append(
                (name, f"{path.relative_to(CONF)}: {where}={value!r}, default {default!r}")
            )

    def walk(node: dict, prefix: list[str]) -> None:
        for key, value in node.items():
            keys = [*prefix, str(key)]
            parent = ".".join(keys[:-1])
            composed = OmegaConf.select(cfg, parent) if parent else cfg
            target = None
            if isinstance(composed, DictConfig):
                target = composed.get("_target_")
            where = ".".join(keys)
            mine = isinstance(target, str) and target.startswith("medvqa.")
            # A node defined here (its `_target_` written in this file) below a group's node:
            # a group's own options (prompt, task) vary a class that holds the defaults, as
            # plug-ins do; other files (experiments, studies) choose, they do not define.
            home = "_target_" in node and len(keys) > 2
            owner = get_object(target) if mine and home and key != "_target_" else None
            typed = _typed_field(target, str(key)) if owner is not None else None
            # Resolved only where a default could disagree (a run's paths are Hydra's).
            declared = owner is not None and (
                _default(owner, str(key)) is not inspect.Parameter.empty or typed is not None
            )
            if declared and owner not in generated:
                resolved = _plain(OmegaConf.select(cfg, where))
                check(owner, where, str(key), resolved)
                if typed is not None and isinstance(resolved, dict):
                    for sub, sub_value in resolved.items():
                        check(typed, f"{where}.{sub}", sub, sub_value)
            if isinstance(value, dict):
                walk(value, keys)

    walk(raw, package.split(".") if package else [])
    return found


YAML_FILES = sorted(p.relative_to(CONF).as_posix() for p in CONF.rglob("*.yaml"))


@pytest.mark.parametrize("name", YAML_FILES)
def test_no_yaml_value_disagrees_with_a_class_default(name: str) -> None:
    """Every default once: a key a YAML file sets on a node a medvqa class configures (nested
    `_target_` nodes, typed fields such as the tiny builder's `pretrain`) has no default in
    that class's signature, equal or not, so neither copy can silently win over the other (the
    SmolLM2 builder's seven defaults were copied into its YAML)."""
    found = [d for _, d in _disagreements(CONF / name)]
    assert not found, "a value declared twice (drop one copy): " + str(found)


def _schema_pairs() -> list[tuple[type, object]]:
    from medvqa.training.datamodule import VQADataModule
    from medvqa.training.module import VQAModule
    from medvqa.training.spec import DataSchema, PeftSchema

    return [(DataSchema, VQADataModule), (PeftSchema, VQAModule)]


@pytest.mark.parametrize("pair", range(2))
def test_schemas_and_the_runtime_classes_they_configure_agree(pair: int) -> None:
    """A schema key the runtime class also takes has no other default there (the loaders'
    eval batch size, the projector's rate): one declaration, the schema's."""
    import inspect

    schema, runtime = _schema_pairs()[pair]
    params = inspect.signature(runtime).parameters
    disagree = []
    for field in dataclasses.fields(schema):
        if field.default is dataclasses.MISSING or field.name not in params:
            continue
        default = params[field.name].default
        if default is not inspect.Parameter.empty and default != field.default:
            disagree.append(f"{field.name}: {schema.__name__} {field.default!r}, {default!r}")
    assert not disagree, f"{runtime.__qualname__} disagrees with {schema.__name__}: {disagree}"


@pytest.mark.parametrize("name", sorted(p.stem for p in (CONF / "task").glob("*.yaml")))
def test_a_task_option_is_declared_in_its_yaml_only(name: str) -> None:
    """conf/task/<name>.yaml declares the task's options (`task.eval_splits=...` overrides
    them); the task function takes them without defaults of its own, so the two cannot drift."""
    import inspect

    import yaml
    from hydra.utils import get_object

    raw = yaml.safe_load((CONF / "task" / f"{name}.yaml").read_text())
    node = raw.get("task", raw)
    params = inspect.signature(get_object(node["_target_"])).parameters
    doubled = {
        key: (value, params[key].default)
        for key, value in node.items()
        if key in params
        and params[key].default is not inspect.Parameter.empty
        and not (isinstance(value, str) and value.startswith("${"))
    }
    assert not doubled, f"task={name}: set in the YAML and defaulted in the function: {doubled}"
