"""The trainer's tensors parked in host memory while a colocated vLLM generates (train.offload_during_rollout).

With the hybrid engine vLLM sleeps during the update, but the trainer keeps its weights (a QLoRA 7B: ~5.5
GiB of 4-bit base and bf16 embeddings), adapters and AdamW state on the card while vLLM generates: the
card's peak is the two together. Parked, each tensor's storage is swapped for a host copy (the Parameter
objects stay, so the optimizer, peft and bitsandbytes keep their references) and the card's cache is
emptied for vLLM; unparked, fresh device copies come back.

Every tensor the modules hold on the card goes: parameters, buffers, tensors kept as plain attributes
(rotary embeddings' original_inv_freq) and bitsandbytes' quantization states (absmax, code), because one
tensor left behind keeps its whole allocator segment reserved (transformers loads a model into one
segment). The host copies live in one pinned buffer, kept from step to step: torch rounds each pinned
allocation up to a power of two, and pinning gigabytes costs more than copying them. A frozen tensor is
copied out once; later parks only drop its device copy.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator

import torch

ALIGN = 64  # bytes: every view of the pinned buffer starts aligned for any dtype


class HostPark:
    """Parks and restores every tensor of some modules and optimizers that lives on `device`."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.parked = False
        self._host: dict[object, torch.Tensor] = {}  # slot key -> its host copy (a view of _buffer)
        self._frozen_copied = False  # the frozen tensors' host copies hold their values (since _allocate)
        self._buffer: torch.Tensor | None = None
        self._warned = False  # _warn_if_held: one line per run, not one per step

    def park(self, modules: list[torch.nn.Module], optimizers: list[torch.optim.Optimizer]) -> None:
        if self.parked:
            return
        # the device tensors' last references live in _move_out's frame: gone once it returns, so that the
        # cache can be emptied (a list of them alive here kept the whole trainer on the card: 6 GiB for a
        # QLoRA 7B on an H200 beside vLLM, bench/card_peak.py 2026-12-07)
        try:
            self._move_out(modules, optimizers)
        finally:  # also after a move cut short (a signal): the copies finish, unpark brings back what moved
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)  # the copies are done before the device memory is reused
                torch.cuda.ipc_collect()  # storages another process (vLLM, a merged sync) opened and released
                # cuBLAS/cuBLASLt workspaces come from the caching allocator and stay allocated (~64 MiB on an
                # H100, 2026-12-07); the next matmul after unpark makes them again
                getattr(torch._C, "_cuda_clearCublasWorkspaces", lambda: None)()
                torch.cuda.empty_cache()  # handed back to the driver, where vLLM's wake-up finds it
        if self.device.type == "cuda" and not self._warned:
            self._warned = _warn_if_held(self.device)

    def _move_out(self, modules: list[torch.nn.Module], optimizers: list[torch.optim.Optimizer]) -> None:
        slots = [(s, t) for s, t in _tensors(modules, optimizers) if _on(t, self.device)]
        if any(self._host.get(s.key) is None or not _same_layout(self._host[s.key], t) for s, t in slots):
            self._allocate(slots)
        for slot, tensor in slots:
            host = self._host[slot.key]
            if not (slot.frozen and self._frozen_copied):
                host.copy_(tensor, non_blocking=True)
            slot.put(host)
            self.parked = True  # from the first move on: unpark checks every slot and brings back what moved
        self._frozen_copied = True  # not after a move cut short: the next park copies the frozen ones again

    def unpark(self, modules: list[torch.nn.Module], optimizers: list[torch.optim.Optimizer]) -> None:
        if not self.parked:
            return
        for slot, host in _tensors(modules, optimizers):
            parked = self._host.get(slot.key)
            if parked is not None and host.data_ptr() == parked.data_ptr():  # what park put there
                slot.put(host.to(self.device, non_blocking=True, copy=True))
        self.parked = False

    def host_bytes(self) -> int:
        return 0 if self._buffer is None else self._buffer.numel()

    def _allocate(self, slots: list[tuple[_Slot, torch.Tensor]]) -> None:
        """One pinned buffer for every slot's copy (again when the set of tensors changed: AdamW makes its
        state at the first step)."""
        sizes = [_aligned(t.numel() * t.element_size()) for _, t in slots]
        self._buffer = torch.empty(sum(sizes), dtype=torch.uint8, pin_memory=torch.cuda.is_available())
        self._host, self._frozen_copied, offset = {}, False, 0
        for (slot, tensor), size in zip(slots, sizes):
            nbytes = tensor.numel() * tensor.element_size()
            view = self._buffer[offset : offset + nbytes].view(tensor.dtype).view(tensor.shape)
            self._host[slot.key] = view
            offset += size


HELD_WARN_BYTES = 512 * 2**20  # left on the card after a park: worth a line (a CUDA context is not counted)


def _warn_if_held(device: torch.device) -> bool:
    """One line when the card still holds more than HELD_WARN_BYTES of this process's tensors after a park:
    the plan's offload peak then does not hold. Names the biggest tensors still alive (what to park too).
    -> whether it warned."""
    import gc

    reserved, allocated = torch.cuda.memory_reserved(device), torch.cuda.memory_allocated(device)
    if reserved <= HELD_WARN_BYTES:
        return False
    alive: dict[tuple, int] = {}
    for obj in gc.get_objects():
        if isinstance(obj, torch.Tensor) and obj.is_cuda and _on(obj, device):
            key = (tuple(obj.shape), str(obj.dtype).removeprefix("torch."))
            alive[key] = alive.get(key, 0) + obj.numel() * obj.element_size()
    biggest = sorted(alive.items(), key=lambda kv: -kv[1])[:4]
    named = ", ".join(f"{list(shape)} {dtype} {n / 2**20:.0f} MiB" for (shape, dtype), n in biggest) or "none"
    print(
        f"lite-verl: parked, the trainer still reserves {reserved / 2**30:.2f} GiB on {device} "
        f"({allocated / 2**30:.2f} GiB in live tensors; biggest: {named}): vLLM gets less than the plan says",
        file=sys.stderr,
    )
    return True


def _aligned(nbytes: int) -> int:
    return (nbytes + ALIGN - 1) // ALIGN * ALIGN


def _same_layout(host: torch.Tensor, tensor: torch.Tensor) -> bool:
    return host.shape == tensor.shape and host.dtype == tensor.dtype


def _on(tensor: torch.Tensor, device: torch.device) -> bool:
    if tensor.device.type != device.type:
        return False
    if device.type != "cuda" or device.index is None:
        return True
    return tensor.device.index == device.index


class _Slot:
    """Where a tensor lives: a parameter's data, or an entry of a dict (a module's buffers, its attributes,
    an optimizer state, a quantization state's attributes). `frozen`: nothing changes it between parks."""

    def __init__(self, target: object, name: str, frozen: bool = False) -> None:
        self.target, self.name, self.frozen = target, name, frozen
        self.key = (id(target), name)

    def put(self, tensor: torch.Tensor) -> None:
        if isinstance(self.target, dict):
            self.target[self.name] = tensor
        else:
            setattr(self.target, self.name, tensor)  # Parameter.data: the object stays


def _tensors(
    modules: Iterable[torch.nn.Module], optimizers: Iterable[torch.optim.Optimizer]
) -> Iterator[tuple[_Slot, torch.Tensor]]:
    """(slot, tensor) for every parameter (with its quantization state), buffer, tensor attribute and
    (non-scalar) optimizer state; each once, though tied weights appear under two names. Parking happens
    between updates, with no gradients."""
    seen: set[int] = set()
    for module in modules:
        for p in module.parameters():
            if id(p) in seen:
                continue
            seen.add(id(p))
            if p.grad is not None:
                raise RuntimeError("the trainer cannot park while it holds gradients (mid-update)")
            yield _Slot(p, "data", frozen=not p.requires_grad), p.data
            yield from _quant_state(getattr(p, "quant_state", None), seen)
        for sub in module.modules():
            for name, buf in sub._buffers.items():
                if buf is not None:
                    yield _Slot(sub._buffers, name), buf
            for name, value in vars(sub).items():  # e.g. rotary embeddings' original_inv_freq
                if isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter):
                    yield _Slot(vars(sub), name, frozen=True), value
    for opt in optimizers:
        for state in opt.state.values():
            for name, value in state.items():
                if isinstance(value, torch.Tensor) and value.dim() > 0:
                    yield _Slot(state, name), value


def _quant_state(state: object, seen: set[int]) -> Iterator[tuple[_Slot, torch.Tensor]]:
    """bitsandbytes' QuantState of a 4-bit weight (absmax, code, offset, and a nested state's): frozen."""
    if state is None or id(state) in seen or not hasattr(state, "absmax"):
        return
    seen.add(id(state))
    for name, value in vars(state).items():
        if isinstance(value, torch.Tensor):
            yield _Slot(vars(state), name, frozen=True), value
    yield from _quant_state(getattr(state, "state2", None), seen)


def embeddings_to_host(model: torch.nn.Module, device: torch.device) -> bool:
    """train.embeddings_on_host: the frozen input embedding table moves to host memory for good; each forward
    looks its tokens up there and sends the rows to `device` (a micro-batch of 8 x 384 tokens of a 7B: 22 MB,
    against 1.0 GiB of table). Not for a table that is also the LM head (tied), which the head needs on the
    card (one line says so), nor off CUDA. -> whether it moved. The Parameter object stays (state_dict,
    checkpoints, exports; the optimizer holds none of it: the table is frozen)."""
    embed, head = model.get_input_embeddings(), model.get_output_embeddings()
    weight = embed.weight
    if device.type != "cuda":
        return False
    if head is not None and head.weight.data_ptr() == weight.data_ptr():
        print(
            "lite-verl: train.embeddings_on_host: this model's input embeddings are its LM head (tied), which "
            "needs them on the GPU: they stay there",
            file=sys.stderr,
        )
        return False
    if weight.device.type == "cpu" or weight.requires_grad:
        return False
    embed.to("cpu")  # with its buffers (Gemma's embed_scale); the Parameter objects stay
    embed.register_forward_pre_hook(_ids_to_host)
    embed.register_forward_hook(lambda module, args, out: out.to(device))
    torch.cuda.empty_cache()  # the table's device copy goes back to the driver
    return True


def _ids_to_host(module: torch.nn.Module, args: tuple) -> tuple:
    return (args[0].to("cpu"), *args[1:])
