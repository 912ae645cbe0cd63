"""What fuseval's process accepts of a worker's answer: each output and stage tap a
worker describes is checked (exactly ``torch.Tensor``, a known dtype, a sane shape, on the
right device, no larger than the definition's outputs allow) before fuseval allocates a
buffer for it; what fails is recorded on the call's result and stands in as an
:class:`Opaque` placeholder."""
from __future__ import annotations

import math
from typing import Any

__all__ = ["Opaque", "dtype_of", "output_spec", "tap_specs", "size_limit", "MAX_TAPS"]

MAX_TAPS = 64
_TAP_SLACK_BYTES = 256 << 20


class Opaque:
    """Stands in for an output that is not a tensor, so the shape check names its type."""

    def __init__(self, type_name: str):
        self.type_name = type_name


def dtype_of(name: str):
    import torch
    d = getattr(torch, str(name), None)
    return d if isinstance(d, torch.dtype) else None


def output_spec(d: Any, what: str, res: Any, limit: int, device: str):
    """((shape, dtype) of a buffer for one described tensor, None), or (None, a
    placeholder) with the violation recorded when the tensor must not be copied."""
    if not isinstance(d, dict):
        return None, Opaque("?")
    kind = d.get("kind")
    if kind == "tensor_subclass":
        res.add("bad_outputs", f"{what} is a {str(d.get('type'))[:200]}, a subclass of torch.Tensor; expected "
                "exactly torch.Tensor")
        return None, Opaque(str(d.get("type"))[:200])
    if kind != "tensor":
        res.add("bad_outputs", f"{what} is {str(d.get('type'))[:200]}, expected a tensor")
        return None, Opaque(str(d.get("type"))[:200])
    dtype = dtype_of(d.get("dtype"))
    shape = d.get("shape")
    if dtype is None or not isinstance(shape, list) or len(shape) > 16 \
            or not all(isinstance(s, int) and 0 <= s < (1 << 40) for s in shape):
        res.add("bad_outputs", f"{what}: unreadable description {str(d)[:200]}")
        return None, Opaque("?")
    dev = str(d.get("device"))
    if dev != device and not (device.startswith("cuda") and dev.startswith("cuda")):
        res.add("wrong_device", f"{what} is on device {dev[:40]}, expected {device}")
        return None, Opaque(f"tensor on {dev[:40]}")
    import torch
    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    if nbytes > limit:
        res.add("bad_outputs", f"{what} has shape {tuple(shape)} ({nbytes} bytes), far larger than expected")
        return None, Opaque(f"tensor of shape {tuple(shape)}")
    return (tuple(shape), dtype), None


def tap_specs(items: list, res: Any, limit: int, defn: Any, device: str,
              described: Any = None) -> tuple[list, list[str | None]]:
    """Buffers for the stage taps a call described, one per described tap in the
    worker's order (None where a tap is not read): at most :data:`MAX_TAPS`, named by
    the definition's stages (``stage`` or ``stage.part``), together no larger than the
    call's outputs allow."""
    stages = set(defn.stage_names) if defn is not None and hasattr(defn, "stage_names") else None
    specs: list = []
    names: list[str | None] = []
    total, budget = 0, 8 * limit + _TAP_SLACK_BYTES
    import torch
    for item in items[:MAX_TAPS]:
        spec = name = None
        if isinstance(item, list) and len(item) == 2 and isinstance(item[0], str) \
                and (stages is None or item[0].partition(".")[0] in stages):
            name = item[0]
            spec, _ = output_spec(item[1], f"tap {name!r}", res, budget - total, device)
        if spec is not None:
            total += math.prod(spec[0]) * torch.empty((), dtype=spec[1]).element_size()
        specs.append(spec)
        names.append(name if spec is not None else None)
    count = max(len(items), described if isinstance(described, int) else 0)
    if count > MAX_TAPS:
        res.add("bad_outputs", f"the implementation handed back {count} stage taps; at most {MAX_TAPS} are read")
    return specs, names


def size_limit(expected) -> int:
    import torch
    if not expected:
        return 1 << 34
    total = 0
    for shape, dtype in expected:
        total += math.prod(shape or ()) * torch.empty((), dtype=dtype).element_size()
    return 4 * total + (1 << 20)
