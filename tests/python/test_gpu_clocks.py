"""bench/gpu_clocks.py without a GPU: the window statistics, and a sampler on a fake NVML."""
import ctypes
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "bench"))
import gpu_clocks  # noqa: E402


def test_window_stats_counts_only_the_window():
    samples = [(0.0, 1980, 120.0, 0x0), (1.0, 1650, 690.0, 0x4), (2.0, 1590, 694.0, 0x4), (3.0, 1980, 130.0, 0x1)]
    w = gpu_clocks.window_stats(samples, 0.5, 2.5)
    assert w == {"sm_mhz": 1620.0, "sm_mhz_min": 1590, "power_w": 692.0, "power_capped": 1.0, "clock_samples": 2}
    w = gpu_clocks.window_stats(samples, 0.0, 3.0)
    assert w["power_capped"] == 0.5 and w["sm_mhz_min"] == 1590 and w["clock_samples"] == 4
    assert gpu_clocks.window_stats(samples, 5.0, 6.0) is None


class FakeNvml:
    """The NVML calls the sampler makes; clock 1700 MHz, 650 W, software power cap."""

    def __init__(self):
        self.open = 0

    def nvmlInit_v2(self):
        self.open += 1
        return 0

    def nvmlShutdown(self):
        self.open -= 1
        return 0

    def nvmlDeviceGetHandleByIndex_v2(self, index, handle):
        return 0

    def nvmlDeviceGetHandleByPciBusId_v2(self, bus, handle):
        return 0 if bus == b"00000000:19:00.0" else 2  # NVML_ERROR_INVALID_ARGUMENT

    @staticmethod
    def _set(ref, v):
        ctypes.cast(ref, ctypes.POINTER(type(ref._obj))).contents.value = v
        return 0

    def nvmlDeviceGetClockInfo(self, dev, kind, mhz):
        return self._set(mhz, 1700 if kind == gpu_clocks.NVML_CLOCK_SM else 0)

    def nvmlDeviceGetPowerUsage(self, dev, mw):
        return self._set(mw, 650000)

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, dev, reasons):
        return self._set(reasons, gpu_clocks.REASON_SW_POWER_CAP)


def test_sampler_on_a_fake_nvml():
    nvml = FakeNvml()
    s = gpu_clocks.ClockSampler(pci_bus_id="00000000:19:00.0", period_s=0.01, lib=nvml)
    assert s.error is None and nvml.open == 1
    t0 = time.monotonic()
    time.sleep(0.1)
    w = s.window(t0, time.monotonic())
    s.close()
    assert nvml.open == 0
    assert w is not None and w["sm_mhz"] == 1700 and w["power_w"] == 650.0 and w["power_capped"] == 1.0
    assert w["clock_samples"] >= 3


def test_sampler_reports_why_not():
    nvml = FakeNvml()
    s = gpu_clocks.ClockSampler(pci_bus_id="00000000:01:00.0", lib=nvml)
    assert s.error is not None and "nvmlDeviceGetHandleByPciBusId_v2" in s.error
    assert nvml.open == 0  # (NVML shut down again)
    assert s.window(0.0, time.monotonic()) is None
    s.close()


def test_close_leaves_nvml_open_under_a_stuck_call():
    import threading

    class StuckNvml(FakeNvml):
        def __init__(self):
            super().__init__()
            self.calls = 0
            self.release = threading.Event()

        def nvmlDeviceGetClockInfo(self, dev, kind, mhz):
            self.calls += 1
            if self.calls > 1:  # (the first sample is taken in the constructor)
                self.release.wait(5.0)
            return super().nvmlDeviceGetClockInfo(dev, kind, mhz)

    nvml = StuckNvml()
    s = gpu_clocks.ClockSampler(period_s=0.01, lib=nvml)
    deadline = time.monotonic() + 2.0
    while nvml.calls < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert nvml.calls >= 2
    s.close(join_timeout_s=0.05)
    assert nvml.open == 1 and "did not stop" in s.error  # (not shut down under the running call)
    nvml.release.set()
    s.close()
    assert nvml.open == 0


def test_summary_line_names_the_clocks():
    import results_io as rio

    def point(l, mhz_ours, mhz_triton, capped):
        return {"sweep": "anchor", "name": f"n64 l{l}", "b": 4, "l": l, "h": 8, "g": 1, "p": 64, "n": 64, "q": 128,
                "status": "ok", "floor": {},
                "ours": {"graph_ms": 1.0, "sm_mhz": mhz_ours, "power_capped": capped},
                "triton": {"graph_ms": 3.0, "sm_mhz": mhz_triton, "power_capped": 0.0}}

    s = rio.summarize([point(16384, 1900.0, 1980.0, 0.0), point(65536, 1600.0, 1950.0, 1.0)])
    assert s["anchor"]["ours_sm_mhz_mean"] == 1750.0 and s["anchor"]["ours_sm_mhz_min"] == 1600.0
    line = rio.summary_lines(s)[0]
    assert "SM clock while timed: ours 1750 MHz (slowest point 1600), 50% of samples power-capped; " \
           "Triton 1965 MHz (slowest point 1950), 0% of samples power-capped" in line
