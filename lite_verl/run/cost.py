"""The bill: seconds each role holds and uses each device, priced per GPU model, billed per second.

Held = the device is reserved for the role for the whole run (what a rental charges for).
Busy = the role was actually computing on it. Utilisation = busy / held.
"""

from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass, field

from lite_verl.config import Config


@dataclass
class Ledger:
    devices: dict[str, tuple[str, ...]]  # role -> devices it holds ("cpu", "cuda:0", ...)
    busy: dict[tuple[str, str], float] = field(default_factory=lambda: defaultdict(float))
    started: float = field(default_factory=time.monotonic)
    elapsed_before: float = 0.0  # wall seconds of earlier segments of a resumed run
    on_demand: dict[str, float] = field(default_factory=lambda: defaultdict(float))  # device -> seconds held

    @classmethod
    def from_config(cls, cfg: Config) -> Ledger:
        def devs(gpus: tuple[int, ...]) -> tuple[str, ...]:
            return tuple(f"cuda:{g}" for g in gpus) or ("cpu",)

        return cls(
            devices={
                "rollout": devs(cfg.rollout.gpus),
                "reward": (cfg.reward.device,),
                "train": devs(cfg.train.gpus),
            }
        )

    @contextmanager
    def busy_on(self, role: str):
        t0 = time.monotonic()
        try:
            yield
        finally:
            dt = time.monotonic() - t0
            for d in self.devices[role]:
                self.busy[(role, d)] += dt

    def add_held(self, device: str, seconds: float) -> None:
        """A device held only part of the run (a reward model loaded on demand): billed for this time."""
        self.on_demand[device] += max(seconds, 0.0)

    def add_busy(self, role: str, seconds: float) -> None:
        """Busy time measured elsewhere (a rollout that ran in its worker while the trainer worked)."""
        for d in self.devices[role]:
            self.busy[(role, d)] += max(seconds, 0.0)

    def wall(self) -> float:
        return self.elapsed_before + time.monotonic() - self.started

    def state(self) -> dict:
        return {"wall": self.wall(), "busy": [[r, d, s] for (r, d), s in self.busy.items()],
                "on_demand": dict(self.on_demand)}  # fmt: skip

    def restore(self, state: dict) -> None:
        self.elapsed_before = float(state.get("wall", 0.0))
        for r, d, s in state.get("busy", []):
            self.busy[(r, d)] = float(s)
        for d, s in state.get("on_demand", {}).items():
            self.on_demand[d] = float(s)


@dataclass(frozen=True)
class BillRow:
    role: str
    device: str
    model: str
    held_s: float
    busy_s: float
    cost_usd: float


def bill(ledger: Ledger, cfg: Config) -> list[BillRow]:
    """A GPU is held for the whole wall time (no release yet: the placement issue) and billed once:
    roles that share it (colocated) split its held time in proportion to their busy time on it.
    The CPU is billed for busy time only."""
    wall = ledger.wall()
    sharers: dict[str, list[str]] = {}
    for role, devices in ledger.devices.items():
        for d in devices:
            sharers.setdefault(d, []).append(role)
    rows = []
    for role, devices in ledger.devices.items():
        for d in devices:
            model = cfg.cost.gpu_models[int(d[5:])] if d.startswith("cuda:") else "cpu"
            price = cfg.cost.price_per_hour.get(model, 0.0)
            busy = ledger.busy.get((role, d), 0.0)
            if d in ledger.on_demand and sharers[d] == [role]:  # loaded on demand: held while loaded
                held = ledger.on_demand[d]
            elif d.startswith("cuda:"):
                total_busy = sum(ledger.busy.get((r, d), 0.0) for r in sharers[d])
                share = busy / total_busy if total_busy > 0 else 1 / len(sharers[d])
                held = wall * share
            else:
                held = busy
            rows.append(BillRow(role, d, model, held, busy, held / 3600 * price))
    return rows


def format_bill(rows: list[BillRow]) -> str:
    head = f"{'role':<8} {'device':<8} {'model':<10} {'held h':>8} {'busy h':>8} {'util':>6} {'USD':>8}"
    lines = [head, "-" * len(head)]
    for r in rows:
        util = r.busy_s / r.held_s if r.held_s > 0 else 0.0
        lines.append(
            f"{r.role:<8} {r.device:<8} {r.model:<10} {r.held_s / 3600:>8.4f} {r.busy_s / 3600:>8.4f} "
            f"{util:>6.0%} {r.cost_usd:>8.4f}"
        )
    total = sum(r.cost_usd for r in rows)
    lines.append(f"{'total':<39}{'':>8} {'':>6} {total:>8.4f}")
    if any(r.held_s > 0 and r.busy_s > r.held_s * 1.01 for r in rows):
        lines.append("util > 100%: roles sharing a GPU computed at the same time (rollout.max_staleness=1)")
    return "\n".join(lines)
