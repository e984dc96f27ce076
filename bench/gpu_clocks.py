"""The GPU's SM clock, power draw and clock-event reasons while the benchmark times, sampled
through NVML (libnvidia-ml, by ctypes: no package needed) in a background thread.

Long calls can run at the board's power limit, where the driver lowers the SM clock (H200, 700 W:
1.6-1.75 GHz instead of 1.98 under sustained replay; docs/PERFORMANCE.md, design log v50). The
two implementations draw different power, so each timed window records the clock and power it
ran at, which tells a kernel's change from the run's machine.

Read only: nothing here changes a clock, a power limit or any other setting.
"""
import ctypes
import threading
import time

# clock-event (throttle) reason bits of nvmlDeviceGetCurrentClocksThrottleReasons
REASON_SW_POWER_CAP = 0x4
REASON_HW_SLOWDOWN = 0x8
REASON_SW_THERMAL = 0x20
REASON_HW_THERMAL = 0x40
REASON_HW_POWER_BRAKE = 0x80
NVML_CLOCK_SM = 1


def window_stats(samples, t0, t1):
    """Clock and power over the samples taken in [t0, t1] (monotonic seconds): a dict of
    sm_mhz (mean), sm_mhz_min, power_w (mean), power_capped (fraction of samples with the
    software power cap or the hardware power brake set) and clock_samples; None without samples."""
    inside = [s for s in samples if t0 <= s[0] <= t1]
    if not inside:
        return None
    n = len(inside)
    capped = sum(1 for s in inside if s[3] & (REASON_SW_POWER_CAP | REASON_HW_POWER_BRAKE))
    return {"sm_mhz": round(sum(s[1] for s in inside) / n, 1), "sm_mhz_min": min(s[1] for s in inside),
            "power_w": round(sum(s[2] for s in inside) / n, 1), "power_capped": round(capped / n, 3),
            "clock_samples": n}


class ClockSampler:
    """Samples one GPU every `period_s` until close(). `error` says why not where NVML or the
    device cannot be opened (then no window has samples)."""

    def __init__(self, pci_bus_id=None, index=0, period_s=0.05, lib=None):
        self.samples = []  # (monotonic s, SM MHz, W, reasons)
        self.error = None
        self._stop = threading.Event()
        self._thread = None
        self._nvml = None  # (set once nvmlInit_v2 has succeeded: close() shuts NVML down)
        try:
            nvml = lib if lib is not None else ctypes.CDLL("libnvidia-ml.so.1")
            self._check(nvml.nvmlInit_v2(), "nvmlInit_v2")
            self._nvml = nvml
            self._dev = ctypes.c_void_p()
            if pci_bus_id:
                self._check(self._nvml.nvmlDeviceGetHandleByPciBusId_v2(pci_bus_id.encode(), ctypes.byref(self._dev)),
                            "nvmlDeviceGetHandleByPciBusId_v2")
            else:
                self._check(self._nvml.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(index), ctypes.byref(self._dev)),
                            "nvmlDeviceGetHandleByIndex_v2")
            self._sample()  # (fails here, not in the thread, where a query is missing)
        except Exception as e:  # (OSError: no libnvidia-ml; RuntimeError: a call failed)
            self.error = str(e)[:200]
            self.close()
            return
        self._period = period_s
        self._thread = threading.Thread(target=self._run, name="gpu-clocks", daemon=True)
        self._thread.start()

    @staticmethod
    def _check(rc, what):
        if rc != 0:
            raise RuntimeError(f"{what} returned NVML error {rc}")

    def _sample(self):
        mhz, mw, reasons = ctypes.c_uint(), ctypes.c_uint(), ctypes.c_ulonglong()
        self._check(self._nvml.nvmlDeviceGetClockInfo(self._dev, NVML_CLOCK_SM, ctypes.byref(mhz)),
                    "nvmlDeviceGetClockInfo")
        self._check(self._nvml.nvmlDeviceGetPowerUsage(self._dev, ctypes.byref(mw)), "nvmlDeviceGetPowerUsage")
        self._check(self._nvml.nvmlDeviceGetCurrentClocksThrottleReasons(self._dev, ctypes.byref(reasons)),
                    "nvmlDeviceGetCurrentClocksThrottleReasons")
        self.samples.append((time.monotonic(), int(mhz.value), mw.value / 1000.0, int(reasons.value)))

    def _run(self):
        while not self._stop.wait(self._period):
            try:
                self._sample()
            except Exception as e:
                self.error = str(e)[:200]
                return

    def window(self, t0, t1):
        return window_stats(list(self.samples), t0, t1)

    def close(self, join_timeout_s=1.0):
        """Stops sampling and shuts NVML down, unless the thread is still inside an NVML call after
        join_timeout_s: then NVML stays open (the process's exit closes it), since shutting it down
        under a running call is undefined, and `error` says so."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=join_timeout_s)
            if self._thread.is_alive():
                self.error = f"the sampling thread did not stop within {join_timeout_s} s; NVML left open"
                return
            self._thread = None
        if self._nvml is not None:
            self._nvml.nvmlShutdown()
            self._nvml = None
