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


def save_flat(tensors: dict[str, torch.Tensor], path: Path, dtype: torch.dtype | None = None) -> int:
    """-> bytes written. All tensors are cast to `dtype` (default: the first tensor's) and concatenated
    on their own device, copied to the host once, and written with the header in one call."""
    names = list(tensors)
    dtype = dtype or tensors[names[0]].dtype
    if dtype not in _DTYPES:
        raise ValueError(f"save_flat: unsupported dtype {dtype}")
    flat = torch.cat([tensors[n].detach().reshape(-1).to(dtype) for n in names]).cpu()
    header: dict[str, object] = {}
    offset = 0
    size = flat.element_size()
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
    data = flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)
    return 8 + len(text) + len(data)
