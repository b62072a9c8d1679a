"""medvqa entry point: `python run.py [group=option ...]` (see conf/ and README.md)."""

import hydra
from omegaconf import DictConfig

import medvqa.config  # noqa: F401  (registers the typed schemas with Hydra)
from medvqa.runner import run


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> None:
    run(cfg)


if __name__ == "__main__":
    main()
