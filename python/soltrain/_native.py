"""The native module, wherever it was built: installed next to this file (pip install .), or in a build
tree's build/python/soltrain (scripts/build.sh) when running from a checkout."""
import os
import pathlib

try:
    from . import _soltrain as native
except ImportError:  # a checkout: the module is in the build tree
    import importlib.util

    _here = pathlib.Path(__file__).resolve().parent
    _build = pathlib.Path(os.environ.get("SOLTRAIN_BUILD_DIR", _here.parent.parent / "build"))
    _found = sorted((_build / "python" / "soltrain").glob("_soltrain*.so"))
    if not _found:
        raise ImportError(
            f"soltrain's native module is not built: run `pip install .` or scripts/build.sh "
            f"(looked in {_build / 'python' / 'soltrain'})"
        ) from None
    _spec = importlib.util.spec_from_file_location("soltrain._soltrain", _found[0])
    native = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(native)

SoltrainError = native.SoltrainError
ConfigError = native.ConfigError
DataError = native.DataError
