"""Workload inputs stored as tensors in safetensors files ("blobs"): where a workload's
``{"type": "safetensors", "path": ..., "tensor_key": ...}`` file is, and reading it.

The path is relative to the dataset's root (``data/.../x.safetensors``), which is not the
problem folder: it is looked up under each folder of ``FUSEVAL_BLOB_ROOT`` (a
``os.pathsep`` list), then under the problem folder and each folder above it. Reading
needs the ``safetensors`` package (``pip install safetensors``); a workload whose blob is
missing, or that cannot be read without the package, is left out with the reason
(:func:`unreadable`), found when the folder is read, without opening any file.
"""
from __future__ import annotations

import importlib.util
import os
from typing import Mapping

import torch

__all__ = ["BLOB_ROOT_ENV", "find_blob", "unreadable", "read_tensor"]

BLOB_ROOT_ENV = "FUSEVAL_BLOB_ROOT"


def _roots(directory: str) -> list[str]:
    roots = [r for r in os.environ.get(BLOB_ROOT_ENV, "").split(os.pathsep) if r]
    here = os.path.abspath(directory)
    while True:
        roots.append(here)
        parent = os.path.dirname(here)
        if parent == here:
            return roots
        here = parent


def find_blob(directory: str, path: str) -> str | None:
    """The file a workload's blob ``path`` names (module docstring), or None."""
    if os.path.isabs(path):
        return path if os.path.isfile(path) else None
    for root in _roots(directory):
        candidate = os.path.join(root, path)
        if os.path.isfile(candidate):
            return candidate
    return None


def unreadable(directory: str, name: str, spec: Mapping) -> str | None:
    """Why input ``name``'s blob ``spec`` cannot be read (None: it can)."""
    path, key = spec.get("path"), spec.get("tensor_key")
    if not isinstance(path, str) or not path or not isinstance(key, str) or not key:
        return (f"input {name!r} is safetensors without a 'path' and a 'tensor_key' "
                f"(got path {path!r}, tensor_key {key!r})")
    if importlib.util.find_spec("safetensors") is None:
        return (f"input {name!r} is read from a safetensors blob ({path}), which needs the safetensors "
                "package (pip install safetensors)")
    if find_blob(directory, path) is None:
        return (f"input {name!r} is read from the safetensors blob {path}, which is not present (looked under "
                f"${BLOB_ROOT_ENV} and the problem folder and the folders above it)")
    return None


def read_tensor(directory: str, name: str, spec: Mapping, device: torch.device) -> torch.Tensor:
    """Input ``name``'s tensor from its blob, on ``device``."""
    from safetensors import safe_open
    file = find_blob(directory, spec["path"])
    if file is None:
        raise FileNotFoundError(unreadable(directory, name, spec))
    with safe_open(file, framework="pt") as f:
        if spec["tensor_key"] not in f.keys():
            raise KeyError(f"input {name!r}: the blob {spec['path']} holds no tensor {spec['tensor_key']!r} "
                           f"(it holds {', '.join(sorted(f.keys())[:8])})")
        return f.get_tensor(spec["tensor_key"]).to(device)
