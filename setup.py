"""Package definition for hvdtrain."""
from setuptools import find_packages, setup

setup(
    name="hvdtrain",
    version="0.1.0",
    description="Data-parallel training of TensorFlow 2 / Keras 3 models with Horovod, "
    "behind a TensorLayer-style Trainer.",
    long_description=open("README.md", encoding="utf-8").read() if __import__("os").path.exists("README.md") else "",
    long_description_content_type="text/markdown",
    python_requires=">=3.11,<3.12",
    packages=find_packages(include=["hvdtrain", "hvdtrain.*"]),
    install_requires=["tensorflow==2.21.0", "numpy", "horovod==0.28.1", "tqdm"],
    entry_points={"console_scripts": ["hvdtrain=hvdtrain.cli:main"]},
)
