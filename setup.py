"""Installs tfplace as one import root: the top-level folders map into the `tfplace` namespace.

    tfplace/     -> tfplace            (core: ir, formats, lowering, overheads, rewrite, runtime,
                                        profiling, emulation, cli; docs/architecture.md)
    simulator/   -> tfplace.simulator  (pure event simulator, no TensorFlow import)
    policy/      -> tfplace.policy     (graph-network RL policy)
    baselines/   -> tfplace.baselines  (baseline strategies and planners)
    graph_defs/  -> tfplace.graph_defs (model zoo exporter and exported graphs)
    clusters/    -> tfplace/clusters/  (bundled cluster files, data only: configs and the docs name
                                        them as "clusters/<name>.json", which resolves against the
                                        installed package: tfplace.formats.files.bundled_root)

TensorFlow itself is chosen by an extra (`cpu` or `gpu`) so that a CPU machine never gets two
TensorFlow wheels in one site-packages. Horovod is built after TensorFlow by scripts/setup_env.sh
(it compiles against the installed TensorFlow, so it cannot be an ordinary requirement).
"""

import json
import os

from setuptools import setup

HERE = os.path.dirname(os.path.abspath(__file__))

SUBPACKAGES = ["ir", "formats", "lowering", "overheads", "rewrite", "runtime", "profiling", "emulation", "cli"]

PACKAGE_DIR = {
    "tfplace": "tfplace",
    **{f"tfplace.{sub}": f"tfplace/{sub}" for sub in SUBPACKAGES},
    "tfplace.simulator": "simulator",
    "tfplace.policy": "policy",
    "tfplace.baselines": "baselines",
    "tfplace.graph_defs": "graph_defs",
    "tfplace.graph_defs.models": "graph_defs/models",
    "tfplace.clusters": "clusters",  # data only (no __init__.py): the bundled cluster files
}



def committed_zoo_files():
    """The zoo bundles to ship: those graph_defs/manifest.json marks committed. Not zoo/*: in a
    checkout zoo/ also holds every bundle exported on demand (git-ignored; tens to hundreds of MB),
    which a wheel built there would otherwise carry."""
    with open(os.path.join(HERE, "graph_defs", "manifest.json")) as f:
        models = json.load(f)["models"]
    return [f"zoo/{m['stem']}.{suffix}" for m in models if m["committed"] for suffix in ("json", "pb")]


setup(
    name="tfplace",
    version="0.1.0",
    description="Deployment strategies for TensorFlow training on heterogeneous GPU clusters",
    python_requires=">=3.9,<3.12",  # TF 2.15 ships no cp312 wheels
    packages=list(PACKAGE_DIR),
    package_dir=PACKAGE_DIR,
    package_data={
        "tfplace": ["rewrite/grappler_plugin.cc"],  # built at set-up / first use (tfplace.rewrite.grappler)
        "tfplace.graph_defs": ["manifest.json", *committed_zoo_files(), "profiles/*.json", "profiles/*/*.json"],
        "tfplace.policy": ["split.json", "pretrained/policy.json"],  # the split and the shipped policy
        "tfplace.clusters": ["*.json", "heldout/*.json", "README.md"],
    },
    py_modules=[],
    install_requires=[
        "tensorflow-probability==0.23.0",
        "tf-agents==0.19.0",
        "dm-sonnet==2.0.2",
        "graph-nets==1.1.0",
        "numpy>=1.26,<2",
        "protobuf>=4.25,<5",
        "absl-py>=2.0",
        "scipy>=1.11",
        "matplotlib>=3.7",
    ],
    extras_require={
        "cpu": ["tensorflow-cpu==2.15.1"],
        "gpu": ["tensorflow[and-cuda]==2.15.1"],
        "horovod": ["horovod==0.28.1"],  # needs HOROVOD_* env vars and --no-build-isolation, after TF
        "test": ["pytest>=8"],
    },
    entry_points={"console_scripts": []},
)
