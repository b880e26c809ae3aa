"""Fault injection for tests/test_faults.py, loaded by a child python through PYTHONPATH (never by lite-verl).

LITE_VERL_FAULT=REGEX: the first write to a path matching REGEX after LITE_VERL_FAULT_AFTER such writes fails
with ENOSPC ("No space left on device"), as a full disk would: opening for writing (open, io.open, os.open),
renaming onto it (os.replace), torch.save and safetensors' save_file to it.
"""

import builtins
import errno
import importlib.abc
import io
import os
import re
import sys

_target = os.environ.get("LITE_VERL_FAULT", "")
_after = int(os.environ.get("LITE_VERL_FAULT_AFTER", "0"))
_seen = 0


def _hit(path) -> None:
    global _seen
    if _target and isinstance(path, (str, bytes, os.PathLike)) and re.search(_target, os.fsdecode(path)):
        _seen += 1
        if _seen > _after:
            raise OSError(errno.ENOSPC, "No space left on device", os.fsdecode(path))


def _wrap_open(real):
    def open_(file, mode="r", *args, **kwargs):
        if any(c in mode for c in "wax+"):
            _hit(file)
        return real(file, mode, *args, **kwargs)

    return open_


builtins.open = io.open = _wrap_open(builtins.open)
_os_open, _os_replace = os.open, os.replace


def _open(path, flags, *args, **kwargs):
    if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
        _hit(path)
    return _os_open(path, flags, *args, **kwargs)


def _replace(src, dst, *args, **kwargs):
    _hit(dst)
    return _os_replace(src, dst, *args, **kwargs)


os.open, os.replace = _open, _replace


def _patch(module) -> None:
    """torch.save and safetensors.torch.save_file write from C++/Rust: check their target first."""
    for name in ("save", "save_file"):
        real = getattr(module, name, None)
        if real is not None and not getattr(real, "_faulty", False):

            def saver(obj, f, *args, _real=real, **kwargs):
                _hit(f)
                return _real(obj, f, *args, **kwargs)

            saver._faulty = True
            setattr(module, name, saver)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname not in ("torch", "safetensors.torch"):
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        real_exec = spec.loader.exec_module

        def exec_module(module):
            real_exec(module)
            _patch(module)

        spec.loader.exec_module = exec_module
        return spec


if _target:
    import importlib.util

    sys.meta_path.insert(0, _Finder())
