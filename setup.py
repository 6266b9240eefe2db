"""Build the Cython kernels in mqk/_fast; if they cannot be built, install the pure-Python twins and say so.

Every mqk/_fast/<name>.pyx has a twin mqk/_fast/<name>_py.py. A missing compiler is not fatal: the package
still works (slower), and `import mqk` warns loudly that it runs on the twins.
"""

import glob
import os
import sys

from setuptools import setup
from setuptools.command.build_ext import build_ext


class OptionalBuildExt(build_ext):
    def run(self):
        try:
            super().run()
        except Exception as exc:  # noqa: BLE001 - any build failure falls back to the twins
            self._warn(exc)

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except Exception as exc:  # noqa: BLE001 - any build failure of one kernel falls back to its twin
            self._warn(exc, ext.name)

    @staticmethod
    def _warn(exc, name="mqk._fast"):
        sys.stderr.write(
            f"\n*** WARNING: could not build {name} ({exc}).\n"
            "*** mqk will run on its pure-Python twins, much slower. Install a C compiler and Python headers.\n\n"
        )


def extensions():
    if os.environ.get("MQK_NO_EXTENSIONS"):
        return []
    try:
        from Cython.Build import cythonize
    except ImportError:
        sys.stderr.write("*** WARNING: Cython not available; mqk will run on its pure-Python twins.\n")
        return []
    sources = sorted(glob.glob("mqk/_fast/*.pyx"))
    return cythonize(
        sources,
        language_level=3,
        compiler_directives={"boundscheck": False, "wraparound": False, "cdivision": True},
        quiet=True,
    )


setup(ext_modules=extensions(), cmdclass={"build_ext": OptionalBuildExt})
