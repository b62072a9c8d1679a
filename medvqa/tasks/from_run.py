"""`task=eval eval.from_run=<run dir>`: a run folder is data from a stranger, checked before use.

Run folders travel (downloaded, shared on clusters), so what one may give an evaluation is
limited and checked:
- **choices and plain values, never code**: the record is read as plain values
  (`medvqa.untrusted`); the model and method the weights need are composed from the installed
  conf/ (the run's options, with their classes), and the run's plain values of them, its seed,
  precision and training image mode (`ADOPTED`) set over them. A class the record names where
  the installed option builds another is refused by name; remote code (`trust_remote_code`
  anywhere in the record) only if the command line turns it on. A model or method the user
  composed that is not the run's is refused, never silently replaced;
- **weights checked before any work**: the manifest's method, the record's copy of it, and the
  file's size and SHA-256 (`medvqa.models.saving.verify_weights`);
- **rows the weights never saw**: the run's splits.json names the rows of each split; an
  evaluation on other splits (another shift, dataset or seed, on the command line) is refused
  if any of its test rows, or any row of a case, was in the weights' training split, unless
  `eval.allow_seen_rows=true` says so (recorded). Splits that changed with nothing composed to
  change them (a forgotten `+experiment`, another copy of the data) are refused too.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, MutableMapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from omegaconf import DictConfig, OmegaConf, open_dict

from medvqa.data import records as R
from medvqa.data.shifts import SPLITS_FILE
from medvqa.models.spec import ModelSchema
from medvqa.record import RESULTS_FILE, read_record
from medvqa.tasks.common import ROWS, TRAIN, TRAIN_CASES
from medvqa.training.spec import PeftSchema
from medvqa.untrusted import (
    CALL_KEYS,
    CLASS_KEY,
    TARGET_KEY,
    UntrustedDataError,
    current_class,
    plain_values,
    read_plain_json,
)

log = logging.getLogger(__name__)

# What `task=eval` takes from the run whose weights it evaluates: the weights need that model
# and method (and the method's trained parts depend on whether it was trained with images),
# the seed decides the splits (another seed would test on training rows), and the trainer's
# precision decides the numbers (a bf16 model cannot even run without autocast). Dotted keys
# take one value; the devices and strategy stay this machine's (generation never goes
# through DeepSpeed).
ADOPTED = ("model", "peft", "seed", "trainer.precision", "data.train_image")
# The config groups among them: a composed one that is not the run's is refused.
ADOPTED_CHOICES = ("model", "peft")
# Command-line keys (and the groups that set them) that decide which rows are in which split:
# naming one asks for other splits than the run's, which are then checked row by row.
SPLIT_KEYS = ("dataset", "shift", "seed", "data.limit", "experiment", "study", "debug")
# The adopted plain values the command line may set instead (checked then, row by row).
USER_MAY_SET = ("seed",)
# A config option's name (a file under conf/<group>/): what a record's choice must look like
# before it is composed (no sweep list, no interpolation, no override syntax).
OPTION_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_./-]*")


class RunFolderError(ValueError):
    """A run folder that cannot be evaluated as asked; the message names the file and fix."""


def named_keys(overrides: Sequence[str]) -> list[tuple[str, str]]:
    """(key or group, the override as written) of each command-line override."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(list(overrides))
    return [(o.key_or_group, o.input_line or o.key_or_group) for o in parsed]


def _names(key: str, prefixes: Sequence[str]) -> bool:
    return any(key == p or key.startswith(f"{p}.") for p in prefixes)


def default_choices(config_name: str | None) -> dict[str, Any]:
    """The primary config's group choices with nothing overridden: a group whose composed
    choice differs was chosen by the user (on the command line or through an experiment or a
    study). Empty where Hydra cannot compose here (then only the command line counts)."""
    if not config_name:
        return {}
    try:
        from hydra import compose

        plain = compose(config_name=config_name, overrides=[], return_hydra_config=True)
        return dict(plain.hydra.runtime.choices)
    except Exception as err:  # no initialised Hydra (a script): the command line alone
        log.debug("cannot compose the primary config's defaults: %r", err)
        return {}


def adopt_run(
    cfg: DictConfig,
    choices: Mapping[str, Any],
    overrides: Sequence[str] = (),
    defaults: Mapping[str, Any] | None = None,
) -> tuple[DictConfig, dict[str, Any]]:
    """For `eval.from_run`: `cfg` and `choices` with the model, method and seed of that run.

    `overrides`: the command line (Hydra's task overrides); `defaults`: the primary config's
    group choices (`default_choices`). Values of the adopted groups named on the command line
    (`model.max_new_tokens=32`) are kept over the run's; the split-deciding overrides are
    recorded as `eval.split_overrides` for the row check (`check_unseen`)."""
    from_run = OmegaConf.select(cfg, "eval.from_run")
    if not from_run:
        return cfg, dict(choices)
    where = f"eval.from_run={from_run}"
    path = Path(from_run) / RESULTS_FILE
    remote: list[str] = []
    record = _trained_record(path, where, remote)
    installed = installed_groups(record, f"{where} ({path})")
    trained = OmegaConf.create(record["config"])
    named = named_keys(overrides)
    _check_choices(cfg, trained, choices, named, defaults or {}, where)
    check_trained_weights(Path(from_run), trained, record.get("provenance"))
    trust = ModelSchema.trust_remote_code
    if remote and not OmegaConf.select(cfg, "model.trust_remote_code", default=trust):
        raise RunFolderError(
            f"{where}: the run's {', '.join(remote)} would run the code of its checkpoint "
            f"({OmegaConf.select(trained, 'model.pretrained')}). A run folder never turns it on: "
            "add model.trust_remote_code=true yourself if you trust that code."
        )
    kept = {k: OmegaConf.select(cfg, k) for k, _ in named if _names(k, ADOPTED_CHOICES)}
    cfg = cfg.copy()
    with open_dict(cfg):
        for key in ADOPTED:
            if key in USER_MAY_SET and any(k == key for k, _ in named):
                continue  # the user's (seed=...): the splits it gives are checked row by row
            value = OmegaConf.select(trained, key, default=None)
            if value is None:  # a record from before the key was adopted: keep the composed one
                continue
            if isinstance(value, DictConfig):  # a group: the installed option, the run's values
                schema = OmegaConf.get_type(cfg, key)
                value = _onto(installed.get(key, {}), OmegaConf.to_container(value))
                if schema not in (None, dict):
                    value = OmegaConf.merge(OmegaConf.structured(schema), value)
            OmegaConf.update(cfg, key, value, merge=False)
        for key, value in kept.items():
            if key not in ADOPTED_CHOICES:
                log.info("task=eval: %s=%s from the command line, over the run's", key, value)
                OmegaConf.update(cfg, key, value, merge=False)
        cfg.eval.split_overrides = [
            line
            for key, line in named
            if _names(key, SPLIT_KEYS) and _changes(key, cfg, trained, choices, record)
        ]
    log.info("evaluating the weights of %s: %s", from_run, record.get("choices", {}))
    adopted = {k: v for k, v in record.get("choices", {}).items() if k in ADOPTED_CHOICES}
    return cfg, {**choices, **adopted}


def _trained_record(path: Path, where: str, remote: list[str]) -> dict[str, Any]:
    """The run's record, read as plain values (no class, interpolation or remote code; what
    would run its checkpoint's code is added to `remote`), of a run that trained and recorded
    the config its weights need."""
    if not path.is_file():
        raise FileNotFoundError(f"{where}: no {RESULTS_FILE} there; give a run dir")
    try:
        record = read_record(path, remote)
    except UntrustedDataError:
        raise
    except ValueError as err:  # not a record
        raise RunFolderError(f"{where}: {err}") from err
    if record["status"] not in ("finished", "incomplete"):
        raise RunFolderError(
            f"{where}: the run is {record['status']!r}; only a run that finished training has "
            "weights to evaluate."
        )
    if not isinstance(record.get("config"), dict):
        raise RunFolderError(
            f"{where}: {path} records no config, so the model and method its weights need are "
            "unknown; evaluate a run whose record has one."
        )
    return record


def installed_groups(record: Mapping[str, Any], where: str) -> dict[str, dict[str, Any]]:
    """The adopted groups (`ADOPTED_CHOICES`) as the installed configs compose the run's options
    (`choices`, else the group's `name`), unresolved: what is built, and how, comes from there.
    A class the record names at a key where that option builds another class (or none) is
    refused, naming the key and both classes; an option not among the configs here too."""
    config = record.get("config") or {}
    options: dict[str, str] = {}
    for group in ADOPTED_CHOICES:
        node = config.get(group)
        option = (record.get("choices") or {}).get(group)
        if option is None and isinstance(node, Mapping):
            option = node.get("name")
        if option is None:
            continue  # a record without the group: the composed one stays
        if not isinstance(option, str) or not OPTION_NAME.fullmatch(option):
            raise RunFolderError(
                f"{where}: the run's {group} option {option!r} is not the name of a config "
                f"(conf/{group}/<name>.yaml); the record was edited. Evaluate a run medvqa wrote."
            )
        options[group] = option
    if not options:
        return {}
    try:
        composed = _compose([f"{group}={option}" for group, option in options.items()])
    except Exception as err:  # Hydra's own message says which option is missing and where
        raise RunFolderError(
            f"{where}: the run's {', '.join(f'{g}={o}' for g, o in options.items())} cannot be "
            f"composed here ({type(err).__name__}: {err}). Evaluate it where its configs are "
            "installed (or add their folder with hydra.searchpath)."
        ) from err
    out: dict[str, dict[str, Any]] = {}
    problems: list[str] = []
    for group, option in options.items():
        node = OmegaConf.to_container(composed[group], resolve=False)
        ours = plain_values(node).value  # its `_target_`s as class names, to compare
        problems += _other_classes(config.get(group), ours, group, f"conf/{group}/{option}.yaml")
        out[group] = node  # type: ignore[assignment]
    if problems:
        raise UntrustedDataError(
            f"{where}: the record names classes the installed configs do not build there; "
            "nothing from it was built or imported:\n"
            + "\n".join(f"  - {p}" for p in problems)
            + "\nThe record was edited or written by other code. Use a run folder medvqa "
            "wrote, or compose the config yourself (conf/, the command line)."
        )
    return out


def _compose(overrides: list[str]) -> DictConfig:
    """The primary config with `overrides`, as this process composes: the running app's search
    path (the user's config folders too), or the installed conf/ where Hydra is not set up."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig

    from medvqa import CONF_DIR

    if GlobalHydra.instance().is_initialized():
        name = HydraConfig.get().job.config_name if HydraConfig.initialized() else "config"
        return compose(config_name=name, overrides=overrides)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


def _other_classes(recorded: Any, installed: Any, key: str, source: str) -> list[str]:
    """`key._target_=<class>: why` for each class the record names where `installed` (plain
    values of the composed option) builds another or none."""
    if not isinstance(recorded, Mapping):
        return []
    out = []
    theirs = recorded.get(CLASS_KEY)
    ours = installed.get(CLASS_KEY) if isinstance(installed, Mapping) else None
    if theirs is not None and (
        not isinstance(theirs, str) or current_class(theirs) != current_class(str(ours))
    ):
        builds = f"builds {ours!r}" if ours else "builds nothing"
        out.append(f"{key}.{TARGET_KEY}={theirs!r}: {source} {builds} there")
    for name, value in recorded.items():
        child = installed.get(name) if isinstance(installed, Mapping) else None
        out += _other_classes(value, child, f"{key}.{name}", source)
    return out


def _onto(installed: Mapping[str, Any], recorded: Mapping[str, Any]) -> dict[str, Any]:
    """The installed option's node with the run's plain values over it: its classes and how
    they are called (`_target_`, `_args_`, `_partial_`, ...) stay the installed config's."""
    out = dict(installed)
    for name, value in recorded.items():
        if name == CLASS_KEY or name in CALL_KEYS:
            continue
        if isinstance(value, Mapping) and isinstance(out.get(name), Mapping):
            out[name] = _onto(out[name], value)
        else:
            out[name] = value
    return out


def _changes(
    key: str,
    cfg: DictConfig,
    trained: DictConfig,
    choices: Mapping[str, Any],
    record: Mapping[str, Any],
) -> bool:
    """Whether a command-line override gives another value than the run had (`debug=smoke`
    given again for a smoke run's evaluation changes nothing)."""
    theirs = record.get("choices") or {}
    if key in choices or key in theirs:  # a group: its option
        return choices.get(key) != theirs.get(key)
    return _value(cfg, key) != _value(trained, key)


def _check_choices(
    cfg: DictConfig,
    trained: DictConfig,
    choices: Mapping[str, Any],
    named: Sequence[tuple[str, str]],
    defaults: Mapping[str, Any],
    where: str,
) -> None:
    """Refuse a model or method the user composed that is not the run's: the weights load only
    into the run's, and replacing the user's choice silently evaluated another method than the
    one they asked for."""
    for group in ADOPTED_CHOICES:
        theirs = OmegaConf.select(trained, f"{group}.name", default=None)
        ours = OmegaConf.select(cfg, f"{group}.name", default=None)
        on_line = [line for key, line in named if key == group]
        chosen = bool(on_line) or (group in defaults and choices.get(group) != defaults[group])
        if chosen and theirs is not None and ours != theirs:
            how = on_line[0] if on_line else f"{group}={choices.get(group)} (composed)"
            raise RunFolderError(
                f"{where}: {how} asks for {group} {ours!r}, but the run's weights are "
                f"{group} {theirs!r} (they load only into it). Leave {group} out (task=eval "
                f"takes the run's), or evaluate a run trained with {ours!r}."
            )


def check_trained_weights(
    run_dir: Path, trained: DictConfig, provenance: Mapping[str, Any] | None = None
) -> None:
    """Before any data or model work: the run `eval.from_run` names trained weights, they are
    all there (weights and manifest), the manifest's method is the run's, the manifest is the
    one the run recorded (`provenance["trained"]`: the same training, config fingerprint and
    step), and the weights file is the one the manifest describes (size and SHA-256). A record
    or manifest from before these were kept is evaluated with a warning. A method that trains
    nothing (peft=none) needs none."""
    from medvqa.models.saving import (  # torch: only here
        META_FILE,
        TRAINED_DIR,
        WEIGHTS_FILE,
        read_manifest,
        verify_weights,
    )

    where = f"eval.from_run={run_dir}"
    task = OmegaConf.select(trained, "task.name", default=None)
    if task not in (None, "train_eval"):
        source = OmegaConf.select(trained, "eval.from_run", default=None)
        evaluated = f" (this one evaluated eval.from_run={source})" if source else ""
        raise RunFolderError(
            f"{where}: that is a task={task} run; it trained no weights{evaluated}. Give the "
            "directory of a task=train_eval run."
        )
    if not OmegaConf.select(trained, "peft.fit", default=PeftSchema.fit):
        return
    weights, manifest = run_dir / TRAINED_DIR / WEIGHTS_FILE, run_dir / TRAINED_DIR / META_FILE
    if not weights.is_file() or not manifest.is_file():
        raise FileNotFoundError(
            f"{where}: its trained weights are not there ({weights} and {manifest.name}); they "
            "were moved or deleted. Restore the run's trained/ folder, or train again "
            "(task=train_eval)."
        )
    meta = read_manifest(run_dir / TRAINED_DIR)
    if meta is None:
        raise RunFolderError(f"{where}: {manifest} cannot be read as a manifest; train again")
    method = OmegaConf.select(trained, "peft.name", default=None)
    if method is not None and meta.get("method") != method:
        raise RunFolderError(
            f"{where}: {weights} holds {meta.get('method')!r} weights, but the run's method is "
            f"{method!r}; the folder was overwritten. Train again (task=train_eval)."
        )
    recorded = (provenance or {}).get("trained")
    if isinstance(recorded, dict) and recorded != meta:
        differ = sorted(k for k in {*recorded, *meta} if recorded.get(k) != meta.get(k))
        raise RunFolderError(
            f"{where}: {manifest} is not the manifest the run recorded (they differ in "
            f"{differ}: recorded {[recorded.get(k) for k in differ]}, found "
            f"{[meta.get(k) for k in differ]}); the trained/ folder was replaced by another "
            "training. Evaluate the run that trained these weights, or train again."
        )
    verify_weights(
        run_dir / TRAINED_DIR,
        meta,
        where,
        "Restore the run's trained/ folder from a good copy, or train again (task=train_eval).",
    )


def _read_splits(run_dir: Path) -> dict[str, Any] | None:
    """The trained run's splits.json, its shape checked (None: it records no rows, a run from
    before they were kept). A malformed file is refused naming the file and key."""
    path = run_dir / SPLITS_FILE
    fix = "restore the run's splits.json, or evaluate another run"
    if not path.exists():
        return None
    try:  # plain values (medvqa.untrusted): a file naming code is refused by name
        report = read_plain_json(path, SPLITS_FILE, fix).value
    except UntrustedDataError:
        raise
    except ValueError as err:
        raise RunFolderError(f"{err}; {fix}") from err
    if not isinstance(report, dict):
        raise RunFolderError(f"{path}: not a JSON object; {fix}")
    if ROWS not in report:
        return None
    rows, cases = report.get(ROWS), report.get(TRAIN_CASES)
    ok = isinstance(rows, dict) and all(
        isinstance(ids, list) and all(isinstance(i, str) for i in ids) for ids in rows.values()
    )
    if not ok or TRAIN not in rows:
        raise RunFolderError(f"{path}: {ROWS!r} is not each split's list of row ids; {fix}")
    if not (isinstance(cases, list) and all(isinstance(c, str) for c in cases)):
        raise RunFolderError(f"{path}: {TRAIN_CASES!r} is not a list of case keys; {fix}")
    return report


def _value(cfg: DictConfig, key: str) -> Any:
    """A value as the record reader returns a record's (plain values: classes by name, no
    `trust_remote_code`), so that a composed value and a recorded one compare alike."""
    node = OmegaConf.select(cfg, key, default=None)
    value = OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node
    return plain_values(value).value


def _config_diff(trained: Mapping[str, Any], cfg: DictConfig) -> list[str]:
    """The split-deciding values that differ between the run's record and this composition
    (paths left out: they differ between machines, not between splits)."""
    theirs = OmegaConf.create(dict(trained))
    out = []
    for key in ("dataset", "shift", "seed", "data.limit"):
        a, b = _value(theirs, key), _value(cfg, key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += [f"{key}.{k}: {a.get(k)!r} -> {b.get(k)!r}" for k in sorted({*a, *b})
                    if a.get(k) != b.get(k) and not k.endswith(("root", "dir", "_path"))]  # fmt: skip
        elif a != b:
            out.append(f"{key}: {a!r} -> {b!r}")
    return out


def check_unseen(
    cfg: DictConfig,
    from_run: str | Path,
    dataset: str,
    frames: Mapping[str, pd.DataFrame],
    eval_splits: Sequence[str],
    allow_seen_rows: bool,
    provenance: MutableMapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Before the model loads: the evaluated splits are the run's own, or none of their rows
    (nor any row of a case) was in the weights' training split; else refused, naming the
    counts and the overrides that changed the splits, unless `allow_seen_rows`. Returns what it
    found (kept in provenance["from_run"] and the run's splits.json)."""
    run_dir = Path(from_run)
    where = f"eval.from_run={run_dir}"
    record = read_record(run_dir / RESULTS_FILE)
    trained_cfg = record.get("config") or {}
    overrides = list(OmegaConf.select(cfg, "eval.split_overrides", default=None) or [])
    report = _read_splits(run_dir)
    found: dict[str, Any] = {"from_run": str(run_dir), "allow_seen_rows": allow_seen_rows}
    if provenance is not None:
        provenance["from_run"] = found
    differ = _config_diff(trained_cfg, cfg)
    if report is None:
        found["splits"] = "unchecked"
        if differ and not allow_seen_rows:
            raise RunFolderError(
                f"{where}: its splits.json records no row ids (a run from before they were "
                f"kept), and this evaluation's splits are composed otherwise ({'; '.join(differ)}"
                "): whether the weights trained on its test rows cannot be checked. Compose the "
                "run's splits, or add eval.allow_seen_rows=true to evaluate anyway (recorded)."
            )
        log.warning("%s: its splits.json records no row ids; the rows are unchecked", where)
        return found
    _check_trained_rows(run_dir, report, where)
    theirs = {s: set(ids) for s, ids in report[ROWS].items()}
    if all(set(frames[s][R.ID].astype(str)) == theirs.get(s) for s in eval_splits):
        found["splits"] = "the run's"
        return found
    found["splits"] = "composed"
    found["differ"] = differ
    if not overrides:
        why = "; ".join(differ) or "the same settings, other rows: another copy of the data"
        raise RunFolderError(
            f"{where}: the composed splits are not the run's ({why}), and nothing on the "
            "command line asked for other splits. task=eval evaluates the run's own splits: "
            f"compose them as the run did (its choices: {record.get('choices', {})}), or name "
            "the change (dataset=, shift=..., +experiment=) to evaluate other splits."
        )
    seen = _seen(report, frames, eval_splits) if report.get("dataset") == dataset else {}
    found["seen"] = seen
    _check_seen(seen, where, overrides, differ, allow_seen_rows)
    return found


def _check_trained_rows(run_dir: Path, report: Mapping[str, Any], where: str) -> None:
    """splits.json's training rows are those the weights' manifest says they trained on: the
    check below compares against this file, so a replaced or edited one is refused first."""
    from medvqa.models.saving import TRAINED_DIR, read_manifest, rows_digest

    manifest = read_manifest(run_dir / TRAINED_DIR) or {}
    digest = manifest.get("trained_rows")
    if digest is not None and digest != rows_digest(report[ROWS][TRAIN]):
        raise RunFolderError(
            f"{where}: splits.json's training rows are not those its weights trained on (the "
            f"manifest records {digest}); the file was replaced or edited. Restore it."
        )


def _check_seen(
    seen: Mapping[str, Mapping[str, int]],
    where: str,
    overrides: Sequence[str],
    differ: list[str],
    allow_seen_rows: bool,
) -> None:
    """Other splits than the run's (given by `overrides`) pass only where the weights trained
    on none of their test rows or cases, or where `allow_seen_rows` says to evaluate anyway
    (warned, and recorded by the caller)."""
    if sum(v["rows"] + v["case_rows"] for v in seen.values()) == 0:
        log.info(
            "%s: other splits than the run's (%s); none of their test rows, nor any of their "
            "cases, was in the weights' training split",
            where,
            ", ".join(overrides),
        )
        return
    counts = "; ".join(
        f"{s}: {v['rows']} of {v['of']} rows trained on, {v['case_rows']} more of a case "
        "trained on" for s, v in seen.items() if v["rows"] or v["case_rows"]
    )  # fmt: skip
    message = (
        f"{where}: {', '.join(overrides)} gives other splits than the run's, and the weights "
        f"trained on rows of their test splits ({counts}); changed: {'; '.join(differ)}"
    )
    if allow_seen_rows:
        log.warning("%s. Evaluated anyway (eval.allow_seen_rows=true, recorded).", message)
        return
    raise RunFolderError(
        f"{message}. Its scores would not measure generalisation. Drop the override (the run's "
        "splits are evaluated), or add eval.allow_seen_rows=true to evaluate anyway (recorded "
        "in results.json)."
    )


def _seen(
    report: Mapping[str, Any], frames: Mapping[str, pd.DataFrame], eval_splits: Sequence[str]
) -> dict[str, dict[str, int]]:
    """Per evaluated split: rows the weights trained on, and rows of a case they trained on
    that this composition's own training split does not hold (a shift that shares cases
    between its train and test by design shares them for a run of its own too)."""
    trained_ids = set(report[ROWS][TRAIN])
    trained_cases = set(report[TRAIN_CASES])
    own_cases = set(frames[TRAIN][R.CASE_ID].dropna().astype(str)) if TRAIN in frames else set()
    out = {}
    for split in eval_splits:
        frame = frames[split]
        ids = frame[R.ID].astype(str)
        cases = frame[R.CASE_ID].astype(str).where(frame[R.CASE_ID].notna())
        by_id = ids.isin(trained_ids)
        by_case = ~by_id & cases.isin(trained_cases - own_cases)
        out[split] = {"rows": int(by_id.sum()), "case_rows": int(by_case.sum()), "of": len(frame)}
    return out
