"""`medvqa-run` and `python run.py`: compose the shipped configs (`medvqa.CONF_DIR`: conf/ in
a checkout, medvqa/conf in an installed wheel) with the command line's overrides and run the
job. One `@hydra.main` for both, so an installed wheel trains as the checkout does."""

import hydra
from omegaconf import DictConfig

import medvqa.config  # noqa: F401  (registers the typed schemas with Hydra)
from medvqa import CONF_DIR
from medvqa.runner import run


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
def main(cfg: DictConfig) -> None:
    run(cfg)


if __name__ == "__main__":
    main()
