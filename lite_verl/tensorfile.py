"""Write many tensors as one safetensors file with a single device-to-host copy and a single write.

`safetensors.torch.save_file` copies each tensor to the host separately (one sync each: hundreds per
LoRA adapter) and refuses views of one buffer; the format itself is simple (8-byte header length, a
JSON header of dtype/shape/byte offsets, then the bytes), so the adapter sync writes it directly.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import torch

_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16", torch.int32: "I32"}


Layout = list[tuple[str, tuple[int, ...], int]]  # (name, shape, element offset) of each tensor


class FlatBuffer:
    """Many tensors packed into one reused buffer of one dtype: one kernel to gather them, one copy to
    the host. The buffers (on the tensors' device; on the host: pinned, or in shared memory so another
    process maps it instead of receiving a copy) are made once and reused while the layout holds."""

    def __init__(self, host: str = "pinned") -> None:
        if host not in ("pinned", "shared", "none"):
            raise ValueError(f"FlatBuffer: host must be pinned, shared or none, not {host!r}")
        self.host = host
        self.layout: Layout = []
        self._key: tuple | None = None
        self.device_buf: torch.Tensor | None = None
        self.host_buf: torch.Tensor | None = None

    def pack(self, tensors: dict[str, torch.Tensor], dtype: torch.dtype | None = None) -> torch.Tensor:
        """-> the device buffer holding every tensor, cast to `dtype` (default: the first tensor's)."""
        names = list(tensors)
        dtype = dtype or tensors[names[0]].dtype
        device = tensors[names[0]].device
        key = (tuple((n, tuple(tensors[n].shape)) for n in names), dtype, device)
        if key != self._key:
            self._allocate(tensors, names, dtype, device)
            self._key = key
        assert self.device_buf is not None
        torch.cat([tensors[n].detach().reshape(-1).to(dtype) for n in names], out=self.device_buf)
        return self.device_buf

    def to_host(self) -> torch.Tensor:
        """The packed tensors on the host (the device buffer itself when that is the CPU)."""
        assert self.device_buf is not None and self.host_buf is not None
        if self.host_buf is not self.device_buf:
            self.host_buf.copy_(self.device_buf)
        return self.host_buf

    def _allocate(self, tensors, names, dtype, device) -> None:
        self.layout, offset = [], 0
        for n in names:
            self.layout.append((n, tuple(tensors[n].shape), offset))
            offset += tensors[n].numel()
        self.device_buf = torch.empty(offset, dtype=dtype, device=device)
        if device.type == "cpu":
            if self.host == "shared":
                self.device_buf.share_memory_()
            self.host_buf = self.device_buf
        elif self.host == "pinned":
            self.host_buf = torch.empty(offset, dtype=dtype, pin_memory=True)
        else:
            self.host_buf = torch.empty(offset, dtype=dtype)
            if self.host == "shared":
                self.host_buf.share_memory_()


def unpack(flat: torch.Tensor, layout: Layout) -> dict[str, torch.Tensor]:
    """Views of a FlatBuffer's tensors (no copy)."""
    out = {}
    for name, shape, offset in layout:
        n = 1
        for d in shape:
            n *= d
        out[name] = flat[offset : offset + n].view(shape)
    return out


class FlatFileWriter:
    """save_flat for a tensor set written again and again (an adapter after every update): the header
    and the staging buffers are made once."""

    def __init__(self) -> None:
        self._buffer = FlatBuffer("pinned")
        self._layout: Layout | None = None
        self._header = b""

    def write(self, tensors: dict[str, torch.Tensor], path: Path, dtype: torch.dtype | None = None) -> int:
        dtype = dtype or next(iter(tensors.values())).dtype
        if dtype not in _DTYPES:
            raise ValueError(f"save_flat: unsupported dtype {dtype}")
        self._buffer.pack(tensors, dtype)
        if self._buffer.layout is not self._layout:
            self._header = _header(self._buffer.layout, dtype)
            self._layout = self._buffer.layout
        host = self._buffer.to_host()
        with open(path, "wb") as f:
            f.write(self._header)
            f.write(memoryview(host.view(torch.uint8).numpy()))
        return len(self._header) + host.numel() * host.element_size()


def _header(layout: Layout, dtype: torch.dtype) -> bytes:
    size = torch.empty((), dtype=dtype).element_size()
    header: dict[str, object] = {}
    for name, shape, offset in layout:
        n = 1
        for d in shape:
            n *= d
        header[name] = {
            "dtype": _DTYPES[dtype],
            "shape": list(shape),
            "data_offsets": [offset * size, (offset + n) * size],
        }
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned
    return struct.pack("<Q", len(text)) + text


def save_flat(tensors: dict[str, torch.Tensor], path: Path, dtype: torch.dtype | None = None) -> int:
    """-> bytes written. All tensors are cast to `dtype` (default: the first tensor's) and concatenated
    on their own device, copied to the host once, and written with the header in one call."""
    return FlatFileWriter().write(tensors, path, dtype)
