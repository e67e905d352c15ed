"""Installs tfplace as one import root: the top-level folders map into the `tfplace` namespace.

    tfplace/     -> tfplace            (core: ir, formats, lowering, overheads, rewrite, runtime,
                                        profiling, emulation, cli; docs/architecture.md)
    simulator/   -> tfplace.simulator  (pure event simulator, no TensorFlow import)
    policy/      -> tfplace.policy     (graph-network RL policy)
    baselines/   -> tfplace.baselines  (baseline strategies and planners)
    graph_defs/  -> tfplace.graph_defs (model zoo exporter and exported graphs)

TensorFlow itself is chosen by an extra (`cpu` or `gpu`) so that a CPU machine never gets two
TensorFlow wheels in one site-packages. Horovod is built after TensorFlow by scripts/setup_env.sh
(it compiles against the installed TensorFlow, so it cannot be an ordinary requirement).
"""

from setuptools import setup

SUBPACKAGES = ["ir", "formats", "lowering", "overheads", "rewrite", "runtime", "profiling", "emulation", "cli"]

PACKAGE_DIR = {
    "tfplace": "tfplace",
    **{f"tfplace.{sub}": f"tfplace/{sub}" for sub in SUBPACKAGES},
    "tfplace.simulator": "simulator",
    "tfplace.policy": "policy",
    "tfplace.baselines": "baselines",
    "tfplace.graph_defs": "graph_defs",
    "tfplace.graph_defs.models": "graph_defs/models",
}

setup(
    name="tfplace",
    version="0.1.0",
    description="Deployment strategies for TensorFlow training on heterogeneous GPU clusters",
    python_requires=">=3.9,<3.12",  # TF 2.15 ships no cp312 wheels
    packages=list(PACKAGE_DIR),
    package_dir=PACKAGE_DIR,
    package_data={
        "tfplace": ["rewrite/grappler_plugin.cc"],  # built at set-up / first use (tfplace.rewrite.grappler)
        "tfplace.graph_defs": ["manifest.json", "zoo/*.json", "zoo/*.pb", "profiles/*.json",
                               "profiles/*/*.json"],
        "tfplace.policy": ["split.json", "pretrained/policy.json"],  # the split and the shipped policy
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
