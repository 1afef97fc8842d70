"""Run the agent package as ``__main__`` given only its directory: ``python -I <dir>/launch.py``.

Why: both backends start the agent by file path, the process backend under ``-I`` (PYTHONPATH
ignored) and the runner image from a bare copy of this directory, yet the package's modules use
relative imports, which need a package. This registers the directory as the package
``crossaudit_agent`` and runs its ``__main__`` with ``runpy``. It does not put the directory's
parent on ``sys.path``: on the host that is ``sandbox/``, whose modules (``docker``,
``deps``, ...) would shadow dependencies of the same name. Stdlib only.
"""

import importlib.util
import os
import runpy
import sys

PACKAGE = "crossaudit_agent"  # a name no dependency is expected to use


def run() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    if sys.path and sys.path[0] and os.path.realpath(sys.path[0]) == os.path.realpath(here):
        del sys.path[0]  # started without -I: the package's modules must not shadow top-level imports
    spec = importlib.util.spec_from_file_location(
        PACKAGE, os.path.join(here, "__init__.py"), submodule_search_locations=[here]
    )
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load the agent package from {here}")
    package = importlib.util.module_from_spec(spec)
    sys.modules[PACKAGE] = package
    spec.loader.exec_module(package)
    runpy.run_module(PACKAGE, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    run()
