"""Metric dynamics of one simulated GPU: noisy, mean-reverting, with thermal lag and throttling.

Each `step(load)` moves every reading part of the way towards the value the current load implies (a
random walk with mean reversion), so a chart of the demo looks like a real GPU: idle near 0-3% and ~35 °C,
rising with load, temperature trailing power, SM clock dropping once the GPU runs hot.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field

IDLE_TEMP_C = 31.0  # plus the idle-power term below: ~35 °C at idle
HOT_TEMP_C = 83.0  # where datacenter GPUs start to pull clocks down (slowdown begins in the 80s)
OVERHEAT_TARGET_C = 98.0  # an overheat fault drives the GPU past the 90 °C cordon threshold
OVERDRAW_SHARE = 1.3  # a power fault draws 130% of TDP, past the 110% cordon threshold
IDLE_SM_CLOCK_MHZ = 345.0
BOOST_SM_CLOCK_MHZ = 1980.0
IDLE_MEM_MIB = 520.0  # driver and context overhead on an idle GPU


def _revert(value: float, target: float, rate: float, noise: float, rng: random.Random) -> float:
    return value + rate * (target - value) + rng.gauss(0.0, noise)


@dataclass
class GpuMetricState:
    mem_total_mib: float
    tdp_w: float
    rng: random.Random
    util: float = 1.0
    temp_c: float = IDLE_TEMP_C
    power_w: float = 0.0
    mem_used_mib: float = IDLE_MEM_MIB
    sm_clock_mhz: float = IDLE_SM_CLOCK_MHZ
    ecc_sbe: int = 0
    ecc_dbe: int = 0
    overheating: bool = False
    overdrawing: bool = False  # a failing voltage regulator: draws past the board's rating
    pending_xid: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.power_w = self.idle_power_w

    @property
    def idle_power_w(self) -> float:
        return 0.1 * self.tdp_w

    def step(self, load: float, mem_share: float) -> dict:
        """Advance one sample with `load` (0..1 of the GPU's compute busy) and `mem_share` (0..1 of memory
        held by busy work); returns the reading."""
        rng = self.rng
        load = min(max(load, 0.0), 1.0)
        util_target = 1.5 + 96.0 * load
        self.util = min(max(_revert(self.util, util_target, 0.5, 1.0 + 2.0 * load, rng), 0.0), 100.0)
        mem_target = IDLE_MEM_MIB + 0.9 * mem_share * (self.mem_total_mib - IDLE_MEM_MIB)
        self.mem_used_mib = min(max(_revert(self.mem_used_mib, mem_target, 0.3, 8.0, rng), 0.0),
                                self.mem_total_mib)
        power_target = self.idle_power_w + 0.85 * self.tdp_w * self.util / 100.0
        if self.overdrawing:
            power_target = OVERDRAW_SHARE * self.tdp_w
        self.power_w = max(_revert(self.power_w, power_target, 0.4, 0.01 * self.tdp_w, rng), 0.0)
        # Temperature follows power with a lag (heat sink mass): a slow reversion rate.
        temp_target = IDLE_TEMP_C + 45.0 * self.power_w / self.tdp_w
        rate = 0.12
        if self.overheating:  # a failed fan or blocked airflow: heats fast regardless of load
            temp_target, rate = OVERHEAT_TARGET_C + 4.0, 0.3
        self.temp_c = _revert(self.temp_c, temp_target, rate, 0.3, rng)
        clock_target = IDLE_SM_CLOCK_MHZ + (BOOST_SM_CLOCK_MHZ - IDLE_SM_CLOCK_MHZ) * min(1.0, load * 3)
        if self.temp_c > HOT_TEMP_C:  # thermal slowdown: roughly 4% of clock per degree over
            clock_target *= max(0.4, 1.0 - 0.04 * (self.temp_c - HOT_TEMP_C))
        self.sm_clock_mhz = max(_revert(self.sm_clock_mhz, clock_target, 0.6, 10.0, rng), 0.0)
        xid, self.pending_xid = self.pending_xid, []
        return {
            "util": round(self.util, 1),
            "mem_used_mib": round(self.mem_used_mib),
            "mem_total_mib": round(self.mem_total_mib),
            "temp_c": round(self.temp_c, 1),
            "power_w": round(self.power_w, 1),
            "sm_clock_mhz": round(self.sm_clock_mhz),
            "ecc_sbe": self.ecc_sbe,
            "ecc_dbe": self.ecc_dbe,
            "xid": xid,
        }

    def inject(self, fault: str, xid: int | None = None) -> None:
        if fault == "overheat":
            self.overheating = True
        elif fault == "ecc":
            # An uncorrectable (double-bit) error; the driver logs it as XID 48.
            self.ecc_dbe += 1
            self.pending_xid.append(48)
        elif fault == "power":
            self.overdrawing = True
        elif fault == "xid":
            self.pending_xid.append(79 if xid is None else xid)  # 79: GPU has fallen off the bus
        elif fault == "clear":
            # Like a GPU reset: faults gone, volatile ECC counters back to zero.
            self.overheating = self.overdrawing = False
            self.ecc_sbe = self.ecc_dbe = 0
            self.pending_xid = []
        else:
            raise ValueError(fault)
