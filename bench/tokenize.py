"""Prompt encoding benchmark: `python bench/tokenize.py [--help]` (the code is in
bench/_prompt_encoding.py).

This file's name is also the standard library's `tokenize`, and the bench folder leads sys.path
while a bench script runs, so `import tokenize` (linecache does it for every traceback) lands
here. Imported that way, it loads the standard library's module and hands it over.
"""

import sys
from pathlib import Path

if __name__ == "__main__":
    import runpy

    runpy.run_path(str(Path(__file__).with_name("_prompt_encoding.py")), run_name="__main__")
else:
    import importlib.util
    import sysconfig

    _spec = importlib.util.spec_from_file_location(
        __name__, Path(sysconfig.get_paths()["stdlib"]) / "tokenize.py"
    )
    if _spec is None or _spec.loader is None:
        raise ImportError("the standard library's tokenize module was not found")
    _module = importlib.util.module_from_spec(_spec)
    sys.modules[__name__] = _module
    _spec.loader.exec_module(_module)
