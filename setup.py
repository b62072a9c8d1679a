"""The package list, which pyproject.toml cannot state: `packages.find` discovers medvqa/ but
not conf/, the Hydra configs, which stay at the repo root (run.py composes `conf`, the docs name
conf/...) and ship in the wheel as medvqa/conf: the package medvqa.conf (its subdirectories
listed too, or setuptools warns about each), whose directory and data (every YAML file,
recursively) pyproject.toml names. The shipped model directories (models/builders/prebuilt/*)
are data of medvqa.models.builders, not packages. `medvqa.CONF_DIR` finds the installed copy,
else the checkout's."""

from setuptools import find_namespace_packages, setup

CONF = "medvqa.conf"
setup(
    packages=[
        *find_namespace_packages(include=["medvqa*"], exclude=["*.prebuilt.*"]),
        CONF,
        *(f"{CONF}.{sub}" for sub in find_namespace_packages("conf")),
    ]
)
