"""setuptools hook: the wheel also carries ``hvdtrain-startup.pth``, so that ``pip install .``
and ``pip install -e .`` start every Python of the environment with hvdtrain's quiet
TensorFlow start-up (``_hvdtrain_startup.py``). Everything else is in pyproject.toml."""
from __future__ import annotations

import os

from setuptools import setup
from setuptools.command.build_py import build_py

PTH_NAME = "hvdtrain-startup.pth"
#: A missing module (hvdtrain uninstalled, the file left behind) is no error at start-up.
PTH_LINE = ("import sys; exec('try: import _hvdtrain_startup as m\\nexcept ImportError: pass\\n"
            "else: m.install()')\n")


def write_pth(directory: str) -> str:
    """Writes the ``.pth`` file into ``directory``; returns its path."""
    path = os.path.join(directory, PTH_NAME)
    with open(path, "w") as f:
        f.write(PTH_LINE)
    return path


class BuildWithStartupHook(build_py):
    """``build_py`` that puts the ``.pth`` file beside the modules (the wheel's root)."""

    def run(self) -> None:
        super().run()
        write_pth(self.build_lib)

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        return [*super().get_outputs(include_bytecode), os.path.join(self.build_lib, PTH_NAME)]


commands = {"build_py": BuildWithStartupHook}
try:  # setuptools >= 64: an editable wheel holds only its own .pth and finder
    from setuptools.command.editable_wheel import editable_wheel
except ImportError:
    editable_wheel = None
if editable_wheel is not None and hasattr(editable_wheel, "_install_namespaces"):
    class EditableWithStartupHook(editable_wheel):
        """``editable_wheel`` that adds the ``.pth`` file to the editable wheel's root
        (through the one step that writes there before the wheel is zipped)."""

        def _install_namespaces(self, installation_dir, pth_prefix):
            super()._install_namespaces(installation_dir, pth_prefix)
            write_pth(str(installation_dir))

    commands["editable_wheel"] = EditableWithStartupHook

setup(cmdclass=commands)
