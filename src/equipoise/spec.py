"""Naming user code in a config: ``"package.module:attr"`` or ``"path/to/file.py:attr"``.

A job's model, dataset, loss, metrics and collate may each be the user's own. Servers
and workers run in other processes (on other machines under Ray), so what travels in the
config is a *spec* string that every process resolves to the same callable by importing
it; the Python API turns a top-level function or class into its spec (`callable_spec`).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from pathlib import Path
from typing import Any, Callable


def one_line(text: object) -> str:
    """``str(text)`` with line breaks collapsed, for one-line messages."""
    return " ".join(str(text).split())


def is_spec(value: str) -> bool:
    """Whether a config string names user code (it has a ``module:attr`` colon)."""
    return isinstance(value, str) and ":" in value


def resolve(spec: str, what: str, error: type[Exception] = ValueError) -> Callable[..., Any]:
    """The callable named by ``spec``; `error` (one line naming `what` and the spec) if it
    cannot be imported, found, or is not callable."""
    module_name, _, attr_path = spec.rpartition(":")
    if not module_name or not attr_path:
        raise error(f"{what} spec {spec!r}: expected 'package.module:function' or 'path/file.py:function'")
    try:
        target: object = (import_file(module_name) if module_name.endswith(".py")
                          else importlib.import_module(module_name))
    except Exception as exc:  # an import-time failure of user code of any kind
        raise error(f"{what} spec {spec!r}: cannot import {module_name!r}: "
                    f"{type(exc).__name__}: {one_line(exc)}") from exc
    for attr in attr_path.split("."):
        if not hasattr(target, attr):
            raise error(f"{what} spec {spec!r}: {module_name!r} has no attribute {attr_path!r}")
        target = getattr(target, attr)
    if not callable(target):
        raise error(f"{what} spec {spec!r}: {attr_path!r} is not callable")
    return target


def import_file(path: str) -> object:
    """Import a user's script by path, under a name other than ``__main__`` so its
    ``if __name__ == "__main__":`` block does not run again in server or worker processes.
    A file inside a package (its folder has an ``__init__.py``) is imported as that
    package's module, the folder above the package's root first on sys.path, so its
    relative and absolute imports of the package work as in the user's script."""
    file = Path(path).resolve()
    package, root = [], file.parent
    while (root / "__init__.py").is_file():
        package.insert(0, root.name)
        root = root.parent
    if package and file.is_file() and all(part.isidentifier() for part in package + [file.stem]):
        if str(root) not in sys.path:
            sys.path.insert(0, str(root))
        return importlib.import_module(".".join(package + [file.stem]))
    name = f"equipoise_user_{abs(hash(str(file)))}"
    if name in sys.modules:
        return sys.modules[name]
    if not file.is_file():
        raise FileNotFoundError(f"no such file {str(file)!r}")
    # As Python runs a script: its folder first on sys.path, so that it imports its
    # neighbours (`import data`, `from model import RNNModel`) from any working directory.
    if str(file.parent) not in sys.path:
        sys.path.insert(0, str(file.parent))
    module_spec = importlib.util.spec_from_file_location(name, file)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    try:
        module_spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def accepted_kwargs(function: Callable[..., object], offered: dict[str, object]) -> dict[str, object]:
    """The subset of ``offered`` keyword arguments that ``function`` accepts
    (all of them if it takes ``**kwargs``; none if its signature is unknown)."""
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return {}
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return dict(offered)
    keyword_kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    names = {p.name for p in parameters if p.kind in keyword_kinds}
    return {key: value for key, value in offered.items() if key in names}


def absolute_spec(spec: str) -> str:
    """A 'path/to/file.py:attr' spec with its path made absolute; anything else as is."""
    path, sep, attr = spec.rpartition(":")
    if sep and path.endswith(".py"):
        return f"{Path(path).resolve()}:{attr}"
    return spec


def callable_spec(value: Any, what: str, error: type[Exception] = ValueError) -> str:
    """The config string for user code: strings pass through (a relative script path
    becomes absolute); a top-level callable becomes 'module:qualname', or
    'path/to/script.py:qualname' when defined in the running script."""
    if isinstance(value, str):
        return absolute_spec(value)
    if not callable(value):
        raise error(f"{what} = {value!r} is neither a name, a spec nor a callable")
    module = getattr(value, "__module__", None)
    qualname = getattr(value, "__qualname__", "")
    if not module or "<locals>" in qualname or "<lambda>" in qualname:
        raise error(f"{what} = {value!r} must be defined at the top level of a module or script "
                    "(every worker imports it in its own process)")
    if module == "__main__":
        main = sys.modules["__main__"]
        if not getattr(main, "__file__", None):
            raise error(f"{what} = {value!r} is defined interactively; put it in a file")
        return f"{Path(main.__file__).resolve()}:{qualname}"
    file = _unreachable_file(module)
    if file is not None:  # the children could not import it by name: by its file, which they can
        return f"{file}:{qualname}"
    return f"{module}:{qualname}"


def _unreachable_file(module: str) -> str | None:
    """The file of `module` if a child process (started with this working directory and
    PYTHONPATH, not this process's sys.path) could not import it by name: a module or a
    package next to the running script, found through the script's folder on sys.path
    (`import_file` imports a package's module by its file as the package's). None if it
    can, or if it has no file of its own."""
    import os
    import sysconfig

    mod = sys.modules.get(module)
    path = getattr(mod, "__file__", None)
    top = sys.modules.get(module.split(".")[0])
    top_file = getattr(top, "__file__", None)
    if not path or not top_file:
        return None  # a namespace package, or built in: left by name
    # the folder the module's name is found from: a single module's, or the package root's parent
    folder = Path(top_file).resolve().parent
    if "." in module or Path(top_file).name == "__init__.py":
        folder = folder.parent
    reachable = {Path.cwd().resolve()}
    reachable |= {Path(p).resolve() for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p}
    reachable |= {Path(p).resolve() for p in sysconfig.get_paths().values() if p}
    reachable |= {Path(p).resolve() for p in sys.path if p and ("site-packages" in p or "dist-packages" in p)}
    return None if folder in reachable else str(Path(path).resolve())


def check_in_child(specs: dict[str, str], env: dict[str, str], timeout: float) -> str | None:
    """Import each spec (config key -> spec) in a fresh Python process with environment
    `env` and this working directory — set up as the job's children are, not with this
    process's sys.path — so that a spec the driver can import and the workers could
    not fails before start. The one-line error of the first that fails, else None."""
    import json
    import subprocess

    try:
        done = subprocess.run([sys.executable, "-m", "equipoise.spec", json.dumps(specs)], env=env,
                              capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return f"importing {', '.join(f'{k} {v!r}' for k, v in specs.items())} in a child process took " \
               f"more than {timeout:g} s"
    if done.returncode == 0:
        return None
    lines = [line for line in done.stdout.splitlines() + done.stderr.splitlines() if line.strip()]
    return lines[0] if done.stdout.strip() else one_line(lines[-1] if lines else f"exit {done.returncode}")


def first_failure(specs: dict[str, str]) -> str | None:
    """Import each spec (config key -> spec) here: the one-line error of the first that
    fails (naming the key and the spec), or None."""
    for key, value in specs.items():
        try:
            resolve(value, key)
        except ValueError as exc:
            return str(exc)
    return None


def _check_main(argv: list[str]) -> int:
    """`python -m equipoise.spec '{"model": "spec", ...}'`: `first_failure`, printed
    with where it was imported from, exit 1; else exit 0."""
    import json

    error = first_failure(json.loads(argv[0]))
    if error is None:
        return 0
    print(f"{error} (imported as the workers import it: from {Path.cwd()}, with this PYTHONPATH)")
    return 1


__all__ = ["absolute_spec", "accepted_kwargs", "callable_spec", "check_in_child", "first_failure", "import_file", "is_spec",
           "one_line", "resolve"]

if __name__ == "__main__":
    sys.exit(_check_main(sys.argv[1:]))
