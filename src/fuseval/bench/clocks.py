"""What clock the GPU ran at while something was timed.

Why it matters: under long tensor-core loads a GPU can reach its power cap and lower the
SM clock well below its burst clock (figures: docs/design/harness.md#clocks-and-the-power-cap).
The ceilings that set a benchmark's floor are
measured in short bursts, so a latency that looks far from its floor may be a kernel
running at the same rate per clock as the ceiling, on a slower clock. A benchmark report
that shows the clock next to each timing lets its reader tell the two apart.

``ClockMonitor`` samples the SM clock, power draw and temperature of one GPU in the
background through ``nvidia-smi --query-gpu ... -lms N`` (a separate process, so the
samples cost the timed work nothing) and answers, for a wall-clock interval, the median
and range of what it saw. Where ``nvidia-smi`` is missing it records nothing and says so.
"""
from __future__ import annotations

import datetime as _dt
import os
import shutil
import signal
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass
from typing import Sequence

import torch

QUERY = "timestamp,clocks.sm,power.draw,temperature.gpu"


@dataclass(frozen=True)
class ClockSample:
    t: float                 # seconds since the epoch (from nvidia-smi's local timestamp)
    sm_mhz: float
    power_w: float | None
    temp_c: float | None


def parse_samples(lines: Sequence[str]) -> list[ClockSample]:
    """``nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu
    --format=csv,noheader,nounits`` lines -> samples; lines that do not parse (a header,
    a half-written last line, "[N/A]" clocks) are skipped."""
    samples = []
    for line in lines:
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 4:
            continue
        try:
            t = _dt.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
            mhz = float(parts[1])
        except ValueError:
            continue

        def num(s: str) -> float | None:
            try:
                return float(s)
            except ValueError:
                return None
        samples.append(ClockSample(t, mhz, num(parts[2]), num(parts[3])))
    return samples


def summarize(samples: Sequence[ClockSample], t0: float, t1: float) -> dict | None:
    """The samples taken in [t0, t1]: count, median/min/max SM clock, median/max power, max
    temperature. None when there is none (an interval shorter than the sampling period)."""
    inside = [s for s in samples if t0 <= s.t <= t1]
    if not inside:
        return None
    mhz = [s.sm_mhz for s in inside]
    power = [s.power_w for s in inside if s.power_w is not None]
    temp = [s.temp_c for s in inside if s.temp_c is not None]
    return {"samples": len(inside), "sm_mhz_median": statistics.median(mhz), "sm_mhz_min": min(mhz),
            "sm_mhz_max": max(mhz), "power_w_median": statistics.median(power) if power else None,
            "power_w_max": max(power) if power else None, "temp_c_max": max(temp) if temp else None}


def _smi_target(device: torch.device) -> str:
    """How nvidia-smi names this torch device: its PCI bus id where torch knows it (robust
    to CUDA_VISIBLE_DEVICES), else the index."""
    try:
        index = device.index if device.index is not None else torch.cuda.current_device()
        bus = getattr(torch.cuda.get_device_properties(index), "pci_bus_id", None)
    except (RuntimeError, AssertionError):            # torch without CUDA
        return str(device.index or 0)
    if isinstance(bus, str) and bus:
        return bus
    return str(index)


class ClockMonitor:
    """Background sampler of one GPU's clock and power (see the module docstring).

        with ClockMonitor(device) as mon:
            t0 = time.time(); work(); t1 = time.time()
            print(mon.window(t0, t1))
    """

    def __init__(self, device: torch.device | str = "cuda", *, interval_ms: int = 100,
                 command: Sequence[str] | None = None):
        self.device = torch.device(device)
        self.interval_ms = interval_ms
        self._command = list(command) if command is not None else None
        self._proc: subprocess.Popen | None = None
        self._path: str | None = None
        self.unavailable: str | None = None      # why there are no samples, if there are none
        self.power_limit_w: float | None = None

    def _default_command(self) -> list[str] | None:
        smi = shutil.which("nvidia-smi")
        if smi is None:
            self.unavailable = "nvidia-smi not found"
            return None
        target = _smi_target(self.device)
        try:
            limit = subprocess.run([smi, "-i", target, "--query-gpu=power.limit", "--format=csv,noheader,nounits"],
                                   capture_output=True, text=True, timeout=20).stdout.strip()
            self.power_limit_w = float(limit.splitlines()[0])
        except (OSError, ValueError, IndexError, subprocess.SubprocessError):
            self.power_limit_w = None
        return [smi, "-i", target, f"--query-gpu={QUERY}", "--format=csv,noheader,nounits",
                f"-lms={self.interval_ms}"]

    def start(self) -> bool:
        """Start sampling; False (with ``unavailable`` set) when it cannot."""
        command = self._command if self._command is not None else self._default_command()
        if command is None:
            return False
        fd, self._path = tempfile.mkstemp(prefix="fuseval_clocks_", suffix=".csv")
        try:
            self._proc = subprocess.Popen(command, stdout=fd, stderr=subprocess.DEVNULL)
        except OSError as exc:
            self.unavailable = f"{command[0]}: {exc}"
            self._proc = None
            return False
        finally:
            os.close(fd)
        return True

    def samples(self) -> list[ClockSample]:
        if self._path is None:
            return []
        with open(self._path) as f:
            return parse_samples(f.read().splitlines())

    def window(self, t0: float, t1: float) -> dict | None:
        """Summary of the samples taken between wall-clock times t0 and t1 (time.time())."""
        return summarize(self.samples(), t0, t1)

    def stop(self) -> None:
        """End sampling (SIGINT first, as a Ctrl-C, so nvidia-smi writes what it holds)."""
        if self._proc is not None:
            self._proc.send_signal(signal.SIGINT)
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None

    def close(self) -> None:
        self.stop()
        if self._path is not None and os.path.exists(self._path):
            os.unlink(self._path)
        self._path = None

    def __enter__(self) -> "ClockMonitor":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def wall() -> float:
    """The clock ``ClockMonitor.window`` expects."""
    return time.time()
