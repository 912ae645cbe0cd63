"""GPU clock sampling (fuseval.bench.clocks) and its place in the benchmark report. The sampler
is exercised with a stand-in for nvidia-smi, so these tests run on the CPU."""
import datetime as dt
import json
import sys
import time

import pytest

from fuseval.bench import render as bench_render, clocks
from test_bench import _report


def _stamp(t: float) -> str:
    return dt.datetime.fromtimestamp(t).strftime("%Y/%m/%d %H:%M:%S.%f")[:-3]


def test_parse_skips_what_is_not_a_sample():
    t = 1_800_000_000.25
    lines = ["timestamp, clocks.sm [MHz], power.draw [W], temperature.gpu",
             f"{_stamp(t)}, 1980, 130.5, 38",
             f"{_stamp(t + 0.5)}, 1455, [N/A], 59",
             f"{_stamp(t + 1)}, [N/A], 600.0, 58",
             f"{_stamp(t + 1.5)}, 14"]                       # a half-written last line
    got = clocks.parse_samples(lines)
    assert [s.sm_mhz for s in got] == [1980.0, 1455.0]
    assert got[0].t == pytest.approx(t, abs=1e-3) and got[1].t == pytest.approx(t + 0.5, abs=1e-3)
    assert got[0].power_w == 130.5 and got[1].power_w is None and got[1].temp_c == 59.0


def test_summary_keeps_only_the_samples_inside_the_interval():
    s = [clocks.ClockSample(10.0 + i, mhz, 100.0 + i, 40.0) for i, mhz in enumerate([1980, 1500, 1600, 1700, 900])]
    got = clocks.summarize(s, 11.0, 13.0)                     # samples 1..3, both ends included
    assert got["samples"] == 3
    assert (got["sm_mhz_min"], got["sm_mhz_median"], got["sm_mhz_max"]) == (1500, 1600, 1700)
    assert got["power_w_max"] == 103.0
    assert clocks.summarize(s, 20.0, 21.0) is None


FAKE_SMI = r"""
import datetime, sys, time
mhz = sys.argv[1]
while True:
    print(datetime.datetime.now().strftime("%Y/%m/%d %H:%M:%S.%f")[:-3] + f", {mhz}, 650.25, 57", flush=True)
    time.sleep(0.02)
"""


def test_monitor_samples_a_running_command_and_cleans_up(tmp_path):
    script = tmp_path / "fake_smi.py"
    script.write_text(FAKE_SMI)
    mon = clocks.ClockMonitor("cpu", command=[sys.executable, str(script), "1515"])
    assert mon.start()
    t0 = clocks.wall()
    time.sleep(0.4)
    t1 = clocks.wall()
    mon.stop()
    got = mon.window(t0, t1)
    assert got is not None and got["samples"] >= 5
    assert got["sm_mhz_median"] == 1515 and got["power_w_max"] == 650.25
    assert mon.window(t1 + 5, t1 + 6) is None                # nothing sampled after the stop
    path = mon._path
    mon.close()
    assert not (path and __import__("os").path.exists(path))


def test_monitor_without_nvidia_smi_says_why(monkeypatch):
    monkeypatch.setattr(clocks.shutil, "which", lambda name: None)
    with clocks.ClockMonitor("cpu") as mon:
        assert mon.unavailable == "nvidia-smi not found"
        assert mon.window(0, time.time()) is None
    broken = clocks.ClockMonitor("cpu", command=["/nonexistent/nvidia-smi"])
    assert not broken.start() and "nonexistent" in broken.unavailable


def _clocked_report():
    report = _report()
    ceil = {"samples": 4, "sm_mhz_median": 1980.0, "sm_mhz_min": 1965.0, "sm_mhz_max": 1980.0,
            "power_w_median": 400.0, "power_w_max": 420.0, "temp_c_max": 45.0}
    report.settings["clocks"] = {"sampled": True, "unavailable": None, "power_limit_w": 700.0,
                                 "interval_ms": 100, "ceilings": ceil}
    for cb, mhz in zip(report.cases, (1500.0, 1440.0)):
        cb.clocks = {"fast": dict(ceil, sm_mhz_median=mhz, sm_mhz_min=mhz - 15, sm_mhz_max=mhz + 15,
                                  power_w_max=690.0),
                     "torch": None}
    return report


def test_report_shows_the_clock_of_the_ceilings_and_of_each_case(tmp_path):
    lines = bench_render.clock_lines(_clocked_report())
    assert lines == ["SM clock while timed: ceilings 1980 MHz (median; 1965-1980); "
                     "fast 1470 MHz (1425-1515, up to 690 W); power limit 700 W"]
    bench_render.write_outputs(_clocked_report(), str(tmp_path), plot=False)
    text = (tmp_path / "bench.txt").read_text()
    assert "fast MHz" in text and "1440" in text and "1500" in text and "SM clock while timed" in text
    data = json.loads((tmp_path / "bench.json").read_text())
    assert data["cases"][1]["clocks"]["fast"]["sm_mhz_median"] == 1440.0


def test_report_says_when_clocks_were_not_sampled():
    report = _report()
    assert bench_render.clock_lines(report) == []                   # an old report: no clock section at all
    report.settings["clocks"] = {"sampled": False, "unavailable": "nvidia-smi not found"}
    assert bench_render.clock_lines(report) == ["GPU clocks not sampled (nvidia-smi not found)"]
