"""`medvqa-run` and `python run.py`: compose the shipped configs (`medvqa.CONF_DIR`: conf/ in
a checkout, medvqa/conf in an installed wheel) with the command line's overrides and run the
job. One `@hydra.main` for both, so an installed wheel trains as the checkout does."""

from medvqa import atomic, numerics, quiet

# Nothing this job makes (Hydra's run folder, the cache, checkpoints, torch's compile cache) is
# group- or world-writable, whatever the umask (docs/security.md).
atomic.restrict_umask()
# MEDVQA_NUMERICS=portable: start again with the CPU-independent kernels, before numpy and
# torch load (they read them once, then).
numerics.reexec_if_requested()
quiet.silence_third_party()  # before the libraries are imported

import hydra  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

import medvqa.config  # noqa: F401, E402  (registers the typed schemas with Hydra)
from medvqa import CONF_DIR  # noqa: E402
from medvqa.runner import run  # noqa: E402


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
def main(cfg: DictConfig) -> None:
    run(cfg)


if __name__ == "__main__":
    main()
