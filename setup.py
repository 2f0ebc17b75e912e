"""The metadata is in pyproject.toml; this only ships ``cadence_patch.pth`` at the root of site-packages.

The .pth is cadence's start-up hook (``cadence.patch``): one line that reads ``CADENCE_PATCH_TRANSFORMERS`` and does
nothing else when it is unset. setuptools has no setting for a file beside the packages, so ``build_py`` copies it:
into the wheel's root for ``pip install .``, and into the editable wheel's root (``install_lib``, where setuptools puts
an editable install's non-package files) for ``pip install -e .``.
"""

import os

from setuptools import setup
from setuptools.command.build_py import build_py

PTH = "cadence_patch.pth"


class build_py_with_pth(build_py):
    def run(self):
        super().run()
        root = self.get_finalized_command("install").install_lib if self.editable_mode else self.build_lib
        self.copy_file(os.path.join("src", PTH), os.path.join(root, PTH), preserve_mode=False)


setup(cmdclass={"build_py": build_py_with_pth})
