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


class FlatFileWriter:
    """save_flat for a tensor set written again and again (an adapter after every update): the header
    and the staging buffers (on the tensors' device and pinned on the host) are made once."""

    def __init__(self) -> None:
        self._layout: tuple | None = None
        self._header = b""
        self._device_buf: torch.Tensor | None = None
        self._host_buf: torch.Tensor | None = None

    def write(self, tensors: dict[str, torch.Tensor], path: Path, dtype: torch.dtype | None = None) -> int:
        names = list(tensors)
        dtype = dtype or tensors[names[0]].dtype
        if dtype not in _DTYPES:
            raise ValueError(f"save_flat: unsupported dtype {dtype}")
        device = tensors[names[0]].device
        layout = (tuple((n, tuple(tensors[n].shape)) for n in names), dtype, device)
        if layout != self._layout:
            self._prepare(tensors, names, dtype, device)
            self._layout = layout
        assert self._device_buf is not None and self._host_buf is not None
        torch.cat([tensors[n].detach().reshape(-1).to(dtype) for n in names], out=self._device_buf)
        if self._host_buf is not self._device_buf:
            self._host_buf.copy_(self._device_buf)
        with open(path, "wb") as f:
            f.write(self._header)
            f.write(memoryview(self._host_buf.view(torch.uint8).numpy()))
        return len(self._header) + self._host_buf.numel() * self._host_buf.element_size()

    def _prepare(self, tensors, names, dtype, device) -> None:
        header: dict[str, object] = {}
        offset = 0
        size = torch.empty((), dtype=dtype).element_size()
        for n in names:
            nbytes = tensors[n].numel() * size
            header[n] = {
                "dtype": _DTYPES[dtype],
                "shape": list(tensors[n].shape),
                "data_offsets": [offset, offset + nbytes],
            }
            offset += nbytes
        text = json.dumps(header, separators=(",", ":")).encode()
        text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned
        self._header = struct.pack("<Q", len(text)) + text
        total = sum(tensors[n].numel() for n in names)
        self._device_buf = torch.empty(total, dtype=dtype, device=device)
        if device.type == "cuda":
            self._host_buf = torch.empty(total, dtype=dtype, pin_memory=True)
        else:
            self._host_buf = self._device_buf


def save_flat(tensors: dict[str, torch.Tensor], path: Path, dtype: torch.dtype | None = None) -> int:
    """-> bytes written. All tensors are cast to `dtype` (default: the first tensor's) and concatenated
    on their own device, copied to the host once, and written with the header in one call."""
    return FlatFileWriter().write(tensors, path, dtype)
