"""AdamW with its moment estimates stored in bf16 (train.optimizer_state_dtype=bfloat16).

torch.optim.AdamW keeps m and v in the parameter's dtype: with fp32 master weights that is 8 of the
16 bytes per parameter that full fine-tuning holds (fp32 weights 4, fp32 gradients 4, m 4, v 4). With
FSDP2's CPU offload all 16 live in host memory: 113 GiB for a 7B model, more than a 128 GB workstation
can spare. Storing m and v in bf16 brings that to 12 bytes (85 GiB). Each step widens a parameter's
moments to fp32, updates them and the fp32 weight exactly as torch.optim.AdamW does, and rounds the
moments back: the weights keep full precision; the moments carry bf16's 8-bit mantissa (0.4% relative),
well inside the noise of their own running averages.
"""

from __future__ import annotations

from typing import Any

import torch


def _local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (FSDP2 parameters), else the tensor: the update is elementwise."""
    return t.to_local() if hasattr(t, "to_local") else t


class LowStateAdamW(torch.optim.Optimizer):
    """torch.optim.AdamW's update (decoupled weight decay, bias-corrected moments, eps outside the
    square root), m and v held in `state_dtype`."""

    def __init__(
        self,
        params: Any,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        state_dtype: torch.dtype = torch.bfloat16,
    ) -> None:
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self.state_dtype = state_dtype

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """torch casts loaded moments to the parameter's dtype (fp32): narrow them again, or a resumed
        run would hold 16 bytes per parameter again."""
        super().load_state_dict(state_dict)
        for state in self.state.values():
            for key in ("exp_avg", "exp_avg_sq"):
                if key in state and state[key].dtype != self.state_dtype:
                    state[key] = state[key].to(self.state_dtype)

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        assert closure is None, "LowStateAdamW takes no closure"
        for group in self.param_groups:
            lr, (b1, b2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                w, g = _local(p), _local(p.grad).to(p.dtype)
                state = self.state[p]
                if not state:
                    state["step"] = torch.zeros((), dtype=torch.float32, device=w.device)
                    state["exp_avg"] = torch.zeros_like(p, dtype=self.state_dtype)
                    state["exp_avg_sq"] = torch.zeros_like(p, dtype=self.state_dtype)
                elif state["step"].device != w.device:  # a loaded state dict keeps step on the CPU
                    state["step"] = state["step"].to(w.device, torch.float32)
                state["step"] += 1
                m_low, v_low = _local(state["exp_avg"]), _local(state["exp_avg_sq"])
                m, v = m_low.to(w.dtype), v_low.to(w.dtype)  # copies when the state is narrower
                # torch's one-pass AdamW kernel (what AdamW(fused=True) runs; CPU and CUDA, torch >= 2.4)
                torch._fused_adamw_([w], [g], [m], [v], [], [state["step"]], amsgrad=False, lr=lr, beta1=b1,
                                    beta2=b2, weight_decay=wd, eps=eps, maximize=False)  # fmt: skip
                if m is not m_low:
                    m_low.copy_(m)
                    v_low.copy_(v)
