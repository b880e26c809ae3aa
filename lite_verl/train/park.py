"""The trainer's tensors parked in host memory while a colocated vLLM generates (train.offload_during_rollout).

With the hybrid engine vLLM sleeps during the update, but the trainer keeps its weights (a QLoRA 7B: ~5.5
GiB of 4-bit base and bf16 embeddings), adapters and AdamW state on the card while vLLM generates: the
card's peak is the two together. Parked, each tensor's storage is swapped for a pinned host copy (the
Parameter objects stay, so the optimizer, peft and bitsandbytes keep their references) and the card's
cache is emptied for vLLM; unparked, fresh device copies come back. The host copies are kept from one
step to the next: pinning gigabytes costs more than copying them.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch


class HostPark:
    """Parks and restores every tensor of some modules and optimizers that lives on `device`."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.parked = False
        self._host: dict[object, torch.Tensor] = {}  # holder's key -> its pinned host copy

    def park(self, modules: list[torch.nn.Module], optimizers: list[torch.optim.Optimizer]) -> None:
        if self.parked:
            return
        for slot, tensor in _tensors(modules, optimizers):
            if not _on(tensor, self.device):
                continue
            host = self._host.get(slot.key)
            if host is None or host.shape != tensor.shape or host.dtype != tensor.dtype:
                host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=torch.cuda.is_available())
                self._host[slot.key] = host
            host.copy_(tensor, non_blocking=True)
            slot.put(host)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # the copies are done before the device memory is reused
            torch.cuda.empty_cache()  # handed back to the driver, where vLLM's wake-up finds it
        self.parked = True

    def unpark(self, modules: list[torch.nn.Module], optimizers: list[torch.optim.Optimizer]) -> None:
        if not self.parked:
            return
        for slot, host in _tensors(modules, optimizers):
            parked = self._host.get(slot.key)
            if parked is not None and host.data_ptr() == parked.data_ptr():  # what park put there
                slot.put(host.to(self.device, non_blocking=True, copy=True))
        self.parked = False


def _on(tensor: torch.Tensor, device: torch.device) -> bool:
    if tensor.device.type != device.type:
        return False
    if device.type != "cuda" or device.index is None:
        return True
    return tensor.device.index == device.index


class _Slot:
    """Where a tensor lives: a parameter's data, or a dict entry (a buffer, an optimizer state)."""

    def __init__(self, target: object, name: str) -> None:
        self.target, self.name = target, name
        self.key = (id(target), name)

    def put(self, tensor: torch.Tensor) -> None:
        if isinstance(self.target, dict):
            self.target[self.name] = tensor
        else:
            setattr(self.target, self.name, tensor)  # Parameter.data / .grad: the object stays


def _tensors(modules: Iterable[torch.nn.Module], optimizers: Iterable[torch.optim.Optimizer]):
    """(slot, tensor) for every parameter, buffer and (non-scalar) optimizer state; each Parameter once,
    though tied weights appear under two names. Parking happens between updates, with no gradients."""
    seen: set[int] = set()
    for module in modules:
        for p in module.parameters():
            if id(p) not in seen:
                seen.add(id(p))
                if p.grad is not None:
                    raise RuntimeError("the trainer cannot park while it holds gradients (mid-update)")
                yield _Slot(p, "data"), p.data
        for sub in module.modules():
            for name, buf in sub._buffers.items():
                if buf is not None:
                    yield _Slot(sub._buffers, name), buf
    for opt in optimizers:
        for state in opt.state.values():
            for name, value in state.items():
                if isinstance(value, torch.Tensor) and value.dim() > 0:
                    yield _Slot(state, name), value
