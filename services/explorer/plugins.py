"""Plugin directories (`explorer.plugin_dirs`): user modules imported at start-up so that their
`@WORKFLOWS.register_module(...)`-style decorators run before the config's names are looked up.

The registries themselves are services/common/registry.py's.
"""

from __future__ import annotations

import importlib.util
import os
import sys

from services.common.errors import InvalidArgument

_loaded_plugin_files: set[str] = set()


def load_plugins(dirs: list[str]) -> list[str]:
    """Import every `*.py` (not starting with `_`) of each plugin directory once; returns the modules loaded.

    Modules register themselves with a registry's `register_module` decorator when imported. The
    directory is put on sys.path so plugin modules can import each other.
    """
    loaded: list[str] = []
    for directory in dirs:
        directory = os.path.abspath(directory)
        if not os.path.isdir(directory):
            raise InvalidArgument(
                f"plugin directory {directory} does not exist", field="explorer.plugin_dirs"
            )
        if directory not in sys.path:
            sys.path.insert(0, directory)
        for filename in sorted(os.listdir(directory)):
            path = os.path.join(directory, filename)
            if not filename.endswith(".py") or filename.startswith("_") or path in _loaded_plugin_files:
                continue
            module_name = f"trinity_plugin_{filename[:-3]}"
            spec = importlib.util.spec_from_file_location(module_name, path)
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            sys.modules[module_name] = module
            spec.loader.exec_module(module)
            _loaded_plugin_files.add(path)
            loaded.append(module_name)
    return loaded
