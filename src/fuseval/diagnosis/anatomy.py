"""The anatomy of one output's error: where it lives along each axis, and its structure.

Everything here reads two tensors (the implementation's output and the oracle's) and the
case's tolerance; nothing runs. An element *fails* when it is outside the tolerance
(|out - ref| > atol + rtol*|ref|) or non-finite where the oracle is finite. The failing
elements are the error's mass: a count, not a sum of magnitudes, so that one huge element
cannot hide a wrong tile and rounding noise cannot pass for a bug.

Location, per axis: the share of failing elements in each slice (the profile), and the
smallest set of slices holding :data:`HOLD` of them; the error is *confined* to that set
when it is at most half the axis (and enough elements fail that a random scatter could not
look confined). The set is named as a part of the axis when it is one (a RoPE half, from
the operator's hints), as the axis's last or first slices (an edge), or as a tile pattern
(the last rows of every tile, one whole tile).

Structure: hypotheses about what the implementation computed instead, each a model of the
output made from the oracle's (a constant factor, an offset, an error depending on one axis
only, slices taken from other slices, a transposition or a reshape in place of a
transposition, zeros, non-finite values). A hypothesis is a finding when the model agrees
with the output, under the case's tolerance, on at least :data:`EXPLAINS` of the elements of
the error's region and on clearly more than the oracle itself does there.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from .hints import Hints, axis_label

__all__ = ["AxisLocation", "Finding", "OutputAnatomy", "anatomy", "precision_level", "agreement",
           "HOLD", "EXPLAINS", "LEVELS"]

HOLD = 0.9            # the slice set that locates the error holds this share of it
EXPLAINS = 0.9        # a structural model explains the error when it agrees on this share
MAX_MAP_AXIS = 512    # slice maps (permutations, shifts) are tried on axes up to this size
MAP_SAMPLE = 4096     # elements of a slice compared when mapping slices

# rounding levels: name and log2 of the unit roundoff; an error's relative RMS is named by
# the nearest level on a log scale (fp16 and TF32 share a 10-bit mantissa: one level)
LEVELS = (("float32", -24.0), ("TF32/fp16", -11.0), ("bf16", -8.0), ("fp8 (e4m3)", -4.0), ("fp4 (e2m1)", -2.0))


@dataclass
class AxisLocation:
    axis: int
    name: str                 # the definition's axis name
    label: str                # how a sentence calls one slice ("head", "token")
    size: int
    profile: list[float]      # share of the failing elements in each slice (sums to 1)
    slices: list[int]         # the smallest set holding HOLD of them
    share: float              # what that set holds
    confined: bool
    where: str                # "heads 1, 3", "head-dim indices 8-15 (second RoPE half)"
    pattern: str | None = None  # "the last slice (an edge)", "the last 1 of every tile of 16"...

    def describe(self) -> str:
        if not self.confined:
            return f"spread over all {self.size} {plural(self.label)}"
        text = f"{self.where} ({self.share:.0%} of the error)"
        return text + (f": {self.pattern}" if self.pattern else "")


@dataclass
class Finding:
    kind: str                 # factor, sign, offset, axis_only, slice_map, transpose, reshape, zeros,
    #                           nonfinite, other_output, precision
    text: str
    agreement: float          # share of the region's elements the model explains
    details: dict[str, Any] = field(default_factory=dict)


@dataclass
class OutputAnatomy:
    name: str
    shape: list[int]
    axis_names: list[str]
    numel: int
    failing: int              # elements outside the tolerance (or non-finite)
    matched_ratio: float
    rel_rms: float            # RMS(out - ref) / RMS(ref) over finite elements
    level: str                # the rounding level nearest that relative error, or "not a rounding level"
    axes: list[AxisLocation]
    findings: list[Finding]
    region: str               # the region the findings were fitted on, in words
    baseline: float           # the oracle's own agreement with the output in that region

    @property
    def passed_elements(self) -> bool:
        return self.failing == 0

    def location(self) -> str:
        confined = [a.describe() for a in self.axes if a.confined]
        return "; ".join(confined) if confined else "spread over every axis"


def plural(label: str) -> str:
    if label.endswith("index"):
        return label[:-5] + "indices"
    if label.endswith("item"):
        return label + "s"
    return label + "s"


def ranges(indices: Sequence[int]) -> str:
    """[1, 2, 3, 7] -> '1-3, 7'."""
    out, run = [], []
    for i in sorted(indices):
        if run and i == run[-1] + 1:
            run.append(i)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [i]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ", ".join(out)


def _allowance(ref: torch.Tensor, tol) -> torch.Tensor:
    return tol.atol + tol.rtol * ref.abs()


def failing_mask(out: torch.Tensor, ref: torch.Tensor, tol) -> torch.Tensor:
    """Elements outside the tolerance, and non-finite ones the oracle does not share."""
    o, r = out.double(), ref.double()
    both = torch.isfinite(o) & torch.isfinite(r)
    same_nonfinite = (~torch.isfinite(o)) & (~torch.isfinite(r)) & ((o == r) | (torch.isnan(o) & torch.isnan(r)))
    diff = torch.where(both, (o - r).abs(), torch.zeros_like(o))
    bad = both & (diff > _allowance(torch.where(both, r, torch.zeros_like(r)), tol))
    return bad | (~both & ~same_nonfinite)


def agreement(out: torch.Tensor, model: torch.Tensor, tol, mask: torch.Tensor | None = None) -> float:
    """Share of elements (within ``mask``) where ``out`` matches ``model`` under ``tol``
    (``model`` in the oracle's place)."""
    ok = ~failing_mask(out, model, tol)
    if mask is not None:
        n = int(mask.sum())
        return float((ok & mask).sum()) / n if n else 1.0
    return float(ok.double().mean()) if ok.numel() else 1.0


def precision_level(rel_rms: float) -> str:
    """The rounding level nearest a relative RMS error (one rounding at unit roundoff u
    gives about 0.6u; pipelines grow it a few times): the level whose log2(u) is nearest,
    an error above 2^-2.5 (fp4's own rounding stays below it) is no rounding level at all."""
    if rel_rms <= 0 or not math.isfinite(rel_rms):
        return "exact" if rel_rms == 0 else "not a rounding level"
    x = math.log2(rel_rms)
    if x > LEVELS[-1][1] - 0.5:
        return "not a rounding level"
    return min(LEVELS, key=lambda lv: abs(lv[1] - x))[0]


# --------------------------------------------------------------------------- location
def _locate(fail: torch.Tensor, axis: int, name: str, hints: Hints) -> AxisLocation:
    size = fail.shape[axis]
    label = axis_label(name, hints)
    dims = [d for d in range(fail.dim()) if d != axis]
    counts = fail.double().sum(dim=dims) if dims else fail.double()
    total = float(counts.sum())
    profile = (counts / total).tolist() if total else [0.0] * size
    order = sorted(range(size), key=lambda i: -profile[i])
    chosen, held = [], 0.0
    for i in order:
        if held >= HOLD - 1e-12:
            break
        chosen.append(i)
        held += profile[i]
    # slices about as heavy as the chosen ones belong with them (90% of 16 equal tokens is
    # 15 of them; the 16th is no less wrong)
    if chosen:
        floor = 0.5 * min(profile[i] for i in chosen)
        chosen += [i for i in order[len(chosen):] if profile[i] >= floor and profile[i] > 0]
        held = sum(profile[i] for i in chosen)
    chosen.sort()
    # a random scatter of few failing elements always looks confined: require some mass
    confined = total > 0 and size > 1 and len(chosen) <= size // 2 and total >= 2 * size
    where = f"{plural(label) if len(chosen) > 1 else label} {ranges(chosen)}"
    pattern = None
    if confined:
        part = _named_part(chosen, name, hints)
        if part:
            where += f" ({part})"
        pattern = _pattern(chosen, size, name, hints)
    return AxisLocation(axis, name, label, size, profile, chosen, held, confined, where, pattern)


def _named_part(chosen: list[int], name: str, hints: Hints) -> str | None:
    """The operator's named parts of the axis that the chosen slices make up exactly."""
    parts = list(hints.parts.get(name, ()))
    covered = [p for p in parts if all(i in chosen for i in range(p.start, p.stop))]
    if covered and sum(p.stop - p.start for p in covered) == len(chosen):
        return " + ".join(p.label for p in covered)
    return None


def _pattern(chosen: list[int], size: int, name: str, hints: Hints) -> str | None:
    """An edge (the last or first slices), or a tile pattern, of the chosen slices."""
    k = len(chosen)
    if chosen == list(range(size - k, size)):
        return f"the last {k} of {size} (the axis's far edge)" if k > 1 else "the last slice (the axis's far edge)"
    if chosen == list(range(k)):
        return f"the first {k} of {size} (the axis's near edge)" if k > 1 else "the first slice (the axis's near edge)"
    tiles = list(hints.tiles.get(name, ())) + [t for t in (8, 16, 32, 64, 128, 256) if t not in hints.tiles.get(name, ())]
    for t in tiles:
        if t >= size or size % t and t not in hints.tiles.get(name, ()):
            continue
        offsets = sorted({i % t for i in chosen})
        n_tiles = math.ceil(size / t)
        in_tiles = sorted({i // t for i in chosen})
        if len(offsets) < t // 2 and len(in_tiles) == n_tiles and k == sum(
                1 for i in range(size) if i % t in offsets):
            if offsets == list(range(t - len(offsets), t)):
                return f"the last {len(offsets)} of every tile of {t} (tile edges)"
            if offsets == list(range(len(offsets))):
                return f"the first {len(offsets)} of every tile of {t} (tile edges)"
            return f"offsets {ranges(offsets)} of every tile of {t}"
        if len(in_tiles) == 1 and k == min(t, size - in_tiles[0] * t) and n_tiles > 1:
            return f"exactly tile {in_tiles[0]} of {n_tiles} (tiles of {t})"
    return None


# --------------------------------------------------------------------------- structure
def _box(locs: list[AxisLocation], shape) -> torch.Tensor:
    """The region: on confined axes their slice sets, elsewhere the whole axis."""
    mask = torch.ones(shape, dtype=torch.bool)
    for loc in locs:
        if loc.confined:
            keep = torch.zeros(loc.size, dtype=torch.bool)
            keep[loc.slices] = True
            view = [1] * len(shape)
            view[loc.axis] = loc.size
            mask = mask & keep.view(view)
    return mask


def _finite(t: torch.Tensor) -> torch.Tensor:
    return torch.where(torch.isfinite(t), t, torch.zeros_like(t))


def _slice_map(o: torch.Tensor, r: torch.Tensor, tol, axis: int, region: torch.Tensor, loc: AxisLocation,
               gen: torch.Generator):
    """For every slice i of the output along ``axis``, the oracle's slice j (possibly
    negated) it matches best, compared on a sample of elements; None if the size is out of range."""
    n = o.shape[axis]
    if n < 2 or n > MAX_MAP_AXIS:
        return None
    os_ = o.movedim(axis, 0).reshape(n, -1)
    rs = r.movedim(axis, 0).reshape(n, -1)
    m = os_.shape[1]
    if m > MAP_SAMPLE:
        pick = torch.randperm(m, generator=gen)[:MAP_SAMPLE]
        os_, rs = os_[:, pick], rs[:, pick]
    allow = tol.atol + tol.rtol * rs.abs()                    # [n_ref, m]
    best = []
    for i in range(n):
        scores = []
        for sign in (1.0, -1.0):
            ok = ((os_[i][None, :] - sign * rs).abs() <= allow).double().mean(dim=1)   # [n_ref]
            scores.append(ok)
        both = torch.stack(scores)                            # [2, n_ref]
        flat = int(both.argmax())
        s, j = divmod(flat, n)
        # prefer the identity on ties: a slice the oracle already explains stays itself
        if both[0, i] >= both[s, j] - 1e-12:
            s, j = 0, i
        best.append((j, -1.0 if s else 1.0))
    return best


def _describe_map(best, loc: AxisLocation, hints: Hints) -> tuple[str, dict] | None:
    n = loc.size
    pairs = [(i, j, s) for i, (j, s) in enumerate(best)]
    moved = [(i, j, s) for i, j, s in pairs if j != i or s < 0]
    if not moved:
        return None
    lab, labs = loc.label, plural(loc.label)
    negated = all(s < 0 for _, _, s in moved)
    neg = ", negated" if negated else ""
    targets = {j for _, j, _ in moved}
    details = {"axis": loc.name, "map": {i: j for i, j, _ in moved}, "negated": negated}
    if all(j == i for i, j, _ in moved):
        return f"{labs if len(moved) > 1 else lab} {ranges([i for i, _, _ in moved])} negated", details
    if len(moved) == 1:
        i, j, _ = moved[0]
        return f"{lab} {i} holds the oracle's {lab} {j}{neg} (values of another {lab})", details
    if len(moved) == n and len(targets) == 1:
        j = next(iter(targets))
        return f"every {lab} holds the oracle's {lab} {j}{neg} (values of {lab} {j} everywhere)", details
    if len(targets) == 1 and len(moved) > 1:
        j = next(iter(targets))
        return (f"{labs} {ranges([i for i, _, _ in moved])} hold the oracle's {lab} {j}{neg} "
                f"(values of another {lab})"), details
    shifts = {j - i for i, j, _ in moved}
    if len(shifts) == 1:
        s = next(iter(shifts))
        if abs(s) == n // 2 and n % 2 == 0 and len(moved) == n:
            return f"the two halves of the {lab} axis exchanged{neg} ({labs} {ranges([i for i, _, _ in moved])})", details
        src = ranges([j for _, j, _ in moved])
        return (f"{labs} {ranges([i for i, _, _ in moved])} hold the oracle's {labs} {src}{neg} "
                f"(shifted by {s:+d})"), details
    if len({(j - i) % n for i, j, _ in moved}) == 1 and len(moved) == n:
        s = (moved[0][1] - moved[0][0]) % n
        return f"the {lab} axis rolled by {s} (slice i holds the oracle's (i+{s}) mod {n}){neg}", details
    if all(j == n - 1 - i for i, j, _ in moved):
        return f"the {lab} axis reversed{neg}", details
    shown = ", ".join(f"{i}<-{j}" for i, j, _ in moved[:8]) + (" ..." if len(moved) > 8 else "")
    kind = "permuted" if len(targets) == len(moved) else "mapped"
    return f"{labs} {kind}{neg}: output {lab} <- oracle {lab} {shown}", details


def anatomy(out: torch.Tensor, ref: torch.Tensor, tol, name: str, axis_names: Sequence[str],
            hints: Hints | None = None, seed: int = 0) -> OutputAnatomy:
    """The anatomy of one output (module docstring). ``axis_names``: the definition's
    names of the output's axes (strings; others are named by position)."""
    hints = hints or Hints()
    o = out.detach().to("cpu", torch.float64)
    r = ref.detach().to("cpu", torch.float64)
    names = [a if isinstance(a, str) else f"axis{k}" for k, a in enumerate(axis_names)]
    names += [f"axis{k}" for k in range(len(names), o.dim())]
    fail = failing_mask(o, r, tol)
    n_fail, numel = int(fail.sum()), o.numel()
    both = torch.isfinite(o) & torch.isfinite(r)
    diff = torch.where(both, o - r, torch.zeros_like(o))
    ref_rms = float(torch.where(both, r, torch.zeros_like(r)).pow(2).mean().sqrt()) if numel else 0.0
    rel = float(diff.pow(2).mean().sqrt()) / ref_rms if ref_rms > 0 else (0.0 if not diff.any() else math.inf)
    locs = [_locate(fail, k, names[k], hints) for k in range(o.dim())] if n_fail else []
    findings: list[Finding] = []
    region_mask = _box(locs, o.shape) if locs else torch.ones(o.shape, dtype=torch.bool)
    region = "; ".join(loc.where for loc in locs if loc.confined) or "the whole output"
    baseline = agreement(o, r, tol, region_mask)
    if n_fail:
        findings = _structure(o, r, tol, fail, region_mask, locs, hints, baseline, seed)
    level = precision_level(rel)
    spread = not any(loc.confined for loc in locs)
    if n_fail == 0 or (spread and not findings and level != "not a rounding level" and n_fail > 0):
        text = (f"error at the level of {level} rounding (relative RMS 2^{math.log2(rel):.1f})" if rel > 0
                else "exact: no error")
        findings.append(Finding("precision", text, 1.0 - n_fail / max(numel, 1),
                                {"level": level, "rel_rms": rel, "spread": spread}))
    return OutputAnatomy(name, list(o.shape), names, numel, n_fail, 1.0 - n_fail / max(numel, 1), rel, level,
                         locs, findings, region, baseline)


def _structure(o, r, tol, fail, region, locs, hints, baseline, seed) -> list[Finding]:
    """The structural hypotheses that explain the error in ``region`` (module docstring)."""
    gen = torch.Generator().manual_seed(seed)
    found: list[Finding] = []
    need = max(EXPLAINS, baseline + 0.2)
    in_region = region & torch.isfinite(r)
    n_region = int(in_region.sum())

    def consider(kind, text, model, details=None, mask=None):
        a = agreement(o, model, tol, in_region if mask is None else mask)
        if a >= need:
            found.append(Finding(kind, text, a, details or {}))

    # non-finite and zero patterns: read directly, no model
    nonfinite = (~torch.isfinite(o)) & torch.isfinite(r)
    n_nf = int(nonfinite.sum())
    n_fail = int(fail.sum())
    if n_nf:
        kinds = []
        for what, m in (("NaN", torch.isnan(o)), ("+Inf", o == math.inf), ("-Inf", o == -math.inf)):
            c = int((m & nonfinite).sum())
            if c:
                kinds.append(f"{c} {what}")
        found.append(Finding("nonfinite", f"{', '.join(kinds)} where the oracle is finite "
                                          f"({n_nf / n_fail:.0%} of the failing elements)", n_nf / n_fail,
                             {"count": n_nf}))
    zeros = (o == 0) & fail & (r != 0)
    n_zero = int(zeros.sum())
    if n_zero >= 0.5 * n_fail:
        found.append(Finding("zeros", f"{n_zero} elements are 0 where the oracle is not "
                                      f"({n_zero / n_fail:.0%} of the failing elements): unwritten or masked out",
                             n_zero / n_fail, {"count": n_zero}))
    if n_region == 0:
        return found
    of, rf = _finite(o), _finite(r)
    sel = in_region & torch.isfinite(o)
    ro, rr = of[sel], rf[sel]
    denom = float((rr * rr).sum())
    if denom > 0:
        c = float((ro * rr).sum()) / denom
        if abs(c - 1) > 1e-3 and abs(c) > 1e-3:
            kind, text = ("sign", "sign flipped (the output is -1 x the oracle's)") if abs(c + 1) < 0.02 else \
                ("factor", f"a constant factor: the output is {c:.4g} x the oracle's")
            consider(kind, text, rf * c, {"factor": c})
    if ro.numel():
        b = float((ro - rr).median())
        if abs(b) > tol.atol:
            consider("offset", f"a constant offset: the output is the oracle's {b:+.4g}", rf + b, {"offset": b})
    diff = of - rf
    constant = any(f.kind == "offset" for f in found)
    for loc in ([] if constant else locs):
        # the error depends on one axis only (a per-head, per-column offset: a missing bias)
        dims = [d for d in range(o.dim()) if d != loc.axis]
        if not dims:
            continue
        w = in_region.double()
        mean = (diff * w).sum(dim=dims, keepdim=True) / w.sum(dim=dims, keepdim=True).clamp(min=1)
        if float(mean.abs().max()) > tol.atol:
            consider("axis_only", f"the error depends on the {loc.label} only: an offset per {loc.label} "
                                  f"(a missing, extra or wrong bias along {loc.name})", rf + mean, {"axis": loc.name})
    for loc in locs:
        best = _slice_map(of, rf, tol, loc.axis, in_region, loc, gen)
        if best is None:
            continue
        described = _describe_map(best, loc, hints)
        if described is None:
            continue
        index = torch.tensor([j for j, _ in best])
        signs = torch.tensor([s for _, s in best], dtype=torch.float64)
        view = [1] * o.dim()
        view[loc.axis] = loc.size
        model = rf.index_select(loc.axis, index) * signs.view(view)
        consider("slice_map", described[0], model, described[1])
    # a transposition, or a reshape where a transposition belongs, of two axes
    for a in range(o.dim()):
        for b in range(a + 1, o.dim()):
            if o.shape[a] == 1 or o.shape[b] == 1:
                continue
            la, lb = locs[a], locs[b]
            if o.shape[a] == o.shape[b]:
                consider("transpose", f"the {la.label} and {lb.label} axes transposed", rf.transpose(a, b),
                         {"axes": [la.name, lb.name]}, mask=torch.isfinite(r))
            moved = rf.transpose(a, b).contiguous().reshape(rf.shape)
            consider("reshape", f"the {la.label} and {lb.label} axes reshaped instead of transposed "
                                f"(a [..., {lb.name}, {la.name}, ...] buffer read as [..., {la.name}, {lb.name}, ...])",
                     moved, {"axes": [la.name, lb.name]}, mask=torch.isfinite(r))
    found.sort(key=lambda f: -f.agreement)
    return found
