"""Runs an end-to-end test script under the test virtualenv when it needs it.

tools/setup.sh --test creates the virtualenv (Debian 12 refuses system-wide
pip installs) at ${KVD_PYENV:-${XDG_CACHE_HOME:-$HOME/.cache}/kvd/pyenv}.

    import test_pyenv
    test_pyenv.require(["openai"], "openai_client_test")
"""

import importlib
import os
import sys


def pyenv_dir():
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(
        os.path.expanduser("~"), ".cache")
    return os.environ.get("KVD_PYENV") or os.path.join(base, "kvd", "pyenv")


def require(modules, test_name):
    """Returns if every module imports; else re-runs the calling script with
    the virtualenv's python, or exits saying how to create it."""
    try:
        for m in modules:
            importlib.import_module(m)
        return
    except ImportError:
        pass
    python = os.path.join(pyenv_dir(), "bin", "python")
    # By sys.prefix, not the interpreter's path: a virtualenv's python is a
    # symlink to the interpreter it was made from.
    if os.path.exists(python) and os.path.realpath(sys.prefix) != \
            os.path.realpath(pyenv_dir()):
        os.execv(python, [python] + sys.argv)
    sys.exit("%s: the Python packages %s are missing; run tools/setup.sh "
             "--test (it creates %s)" % (test_name, ", ".join(modules),
                                        python))
