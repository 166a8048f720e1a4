"""Round-to-nearest quantization: exact error bounds, int4 packing, padding, QuantLinear, quantized tiny models."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from playground.engine.quant.linear import (
    METHODS,
    QuantLinear,
    choose_kernel,
    model_weight_bytes,
    quantize_activations_per_token,
    quantize_model,
)
from playground.engine.quant.rtn import dequantize, expected_nbytes, pack_int4, quantize, unpack_int4


def weight(out: int = 48, cols: int = 576, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(out, cols, generator=g) * 0.05
    w[::7, ::13] *= 20  # outliers, as real weights have
    return w


def per_element(values: torch.Tensor, group: int | None, cols: int) -> torch.Tensor:
    group = cols if group is None else group
    return values.repeat_interleave(group, dim=1)[:, :cols]


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("group", [None, 32, 64, 128])
def test_error_is_at_most_half_a_step(bits, symmetric, group):
    w = weight()
    qt = quantize(w, bits, group, symmetric)
    back = dequantize(qt)
    assert back.shape == w.shape and back.dtype == torch.float32
    step = per_element(qt.scale, group, w.shape[1])
    err = (back - w).abs()
    assert torch.all(err <= step * (0.5 + 1e-5)), float((err / step).max())
    codes = qt.codes()
    top = 2 ** (bits - 1) - 1
    assert int(codes.max()) <= top and int(codes.min()) >= (-top if symmetric else -top - 1)


def test_half_step_bound_catches_truncation():
    """The bound check above would catch floor instead of round: floor errs by up to a whole step."""
    w = weight()
    qt = quantize(w, 8, 32, True)
    floored = torch.floor(w / per_element(qt.scale, 32, w.shape[1]))
    err = (floored * per_element(qt.scale, 32, w.shape[1]) - w).abs()
    assert torch.any(err > per_element(qt.scale, 32, w.shape[1]) * 0.5)


def test_int4_packing_round_trips_all_values_and_nibble_order():
    codes = torch.arange(-8, 8, dtype=torch.int8)
    packed = pack_int4(codes)
    assert packed.dtype == torch.uint8 and packed.numel() == 8
    assert int(packed[0]) == (0 | 1 << 4)  # element 0 in the low nibble (as code + 8), element 1 in the high one
    assert int(packed[7]) == (14 | 15 << 4)
    assert torch.equal(unpack_int4(packed, 16), codes)
    for a in range(-8, 8):
        for b in range(-8, 8):
            pair = torch.tensor([a, b], dtype=torch.int8)
            assert torch.equal(unpack_int4(pack_int4(pair), 2), pair)


@pytest.mark.parametrize("n", [1, 3, 17, 575])
def test_int4_packing_odd_lengths(n):
    codes = torch.randint(-8, 8, (5, n), dtype=torch.int8, generator=torch.Generator().manual_seed(n))
    packed = pack_int4(codes)
    assert packed.shape == (5, (n + 1) // 2)
    assert torch.equal(unpack_int4(packed, n), codes)


def test_pack_rejects_out_of_range():
    with pytest.raises(ValueError):
        pack_int4(torch.tensor([8], dtype=torch.int8))


def test_group_128_on_576_columns_is_padded_and_trimmed():
    w = weight(16, 576)
    w[:, 512:] = w[:, 512:].abs() + 1.0  # a tail group far from zero: zero padding would widen its range
    qt = quantize(w, 4, 128, symmetric=False)
    assert qt.scale.shape == (16, 5) and qt.zero.shape == (16, 5)  # 576 = 4.5 groups -> 5
    assert qt.q.shape == (16, 320) and qt.packed  # 640 padded codes, two per byte
    back = dequantize(qt)
    assert back.shape == (16, 576)
    # The last, half-filled group keeps its own range: padding repeats the last column instead of adding zeros.
    tail = w[:, 512:]
    assert torch.allclose(qt.scale[:, 4], (tail.amax(1) - tail.amin(1)) / 15)
    assert torch.all((back - w).abs() <= per_element(qt.scale, 128, 576) * (0.5 + 1e-5))


def grid_weight(out: int, cols: int, group: int, dyadic: bool) -> torch.Tensor:
    """Weights of the Q4_1 form d * k + m per group of ``group`` columns, each group using k = 0 and k = 15."""
    g = torch.Generator().manual_seed(1)
    k = torch.randint(0, 16, (out, cols // group, group), generator=g).float()
    k[..., 0], k[..., 1] = 0, 15
    if dyadic:
        d = 2.0 ** -torch.randint(4, 9, (out, cols // group, 1), generator=g).float()
        m = -torch.randint(0, 64, (out, cols // group, 1), generator=g).float() * 2.0**-10
    else:
        d = torch.rand(out, cols // group, 1, generator=g) * 0.01 + 1e-3
        m = -torch.rand(out, cols // group, 1, generator=g) * 0.1
    return (k * d + m).reshape(out, cols)


def test_asymmetric_int4_group_32_reproduces_a_q4_1_grid():
    w = grid_weight(32, 576, 32, dyadic=True)
    assert torch.equal(dequantize(quantize(w, 4, 32, symmetric=False)), w)
    w = grid_weight(32, 576, 32, dyadic=False)
    back = dequantize(quantize(w, 4, 32, symmetric=False))
    assert torch.allclose(back, w, rtol=0, atol=1e-7)
    # Group 64 on the same weights does not reproduce them: the test can tell the group size matters.
    assert not torch.allclose(dequantize(quantize(w, 4, 64, symmetric=False)), w, rtol=0, atol=1e-4)


@pytest.mark.parametrize("bits,group,symmetric", [(8, None, True), (8, None, False), (8, 32, True),
                                                  (4, 32, False), (4, 64, False), (4, 128, False), (4, None, True)])
def test_bytes_equal_the_formula(bits, group, symmetric):
    qt = quantize(weight(96, 576), bits, group, symmetric)
    assert qt.nbytes == expected_nbytes(96, 576, bits, group, symmetric)


def test_bytes_by_hand():
    # 1536 x 576 int4 group 32 asymmetric: 576 / 2 code bytes per row + 18 groups x (scale + zero) x 4 bytes.
    qt = quantize(torch.randn(1536, 576), 4, 32, symmetric=False)
    assert qt.nbytes == 1536 * 288 + 1536 * 18 * 8
    # int8 per channel symmetric: one byte per weight + one float scale per row.
    assert quantize(torch.randn(1536, 576), 8).nbytes == 1536 * 576 + 1536 * 4
    # group 128 on 576 columns stores 640 padded codes.
    assert quantize(torch.randn(10, 576), 4, 128, False).nbytes == 10 * 320 + 10 * 5 * 8


def linear_and_input(out: int, cols: int, bias: bool = True) -> tuple[nn.Linear, torch.Tensor]:
    torch.manual_seed(3)
    lin = nn.Linear(cols, out, bias=bias)
    return lin, torch.randn(2, 5, cols)


@pytest.mark.parametrize("bits,group,symmetric", [(8, None, True), (8, 32, False), (4, 32, False), (4, 128, False)])
def test_quant_linear_dequant_path_equals_dequantized_weights(bits, group, symmetric):
    lin, x = linear_and_input(64, 576)
    qt = quantize(lin.weight, bits, group, symmetric)
    layer = QuantLinear(lin, qt, kernel="dequant")
    expected = F.linear(x, dequantize(qt), lin.bias)
    assert torch.allclose(layer(x), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("group", [32, 64, 128])
def test_quant_linear_int4_kernel_matches_within_bfloat16(group):
    lin, x = linear_and_input(64, 576)
    qt = quantize(lin.weight, 4, group, symmetric=False)
    layer = QuantLinear(lin, qt, kernel="int4pack")
    expected = F.linear(x, dequantize(qt), lin.bias)
    got = layer(x)
    assert got.shape == expected.shape and got.dtype == torch.float32
    assert (got - expected).abs().max() <= 0.02 * expected.abs().max()
    # and it is the quantized weight it multiplies, not the float one
    other = F.linear(x, dequantize(quantize(lin.weight, 4, 32 if group != 32 else 64, symmetric=False)), lin.bias)
    assert (got - expected).abs().max() < (other - expected).abs().max()


def test_kernel_rule():
    assert choose_kernel(quantize(torch.randn(1536, 576), 4, 32, False)) == "int4pack"
    assert choose_kernel(quantize(torch.randn(192, 576), 4, 32, False)) == "dequant"  # k/v: fixed cost loses
    assert choose_kernel(quantize(torch.randn(1536, 576), 8)) == "dequant"  # int8 kernel is slower here
    assert choose_kernel(quantize(torch.randn(1536, 576), 4, None, False)) == "dequant"
    with pytest.raises(ValueError):
        QuantLinear(nn.Linear(576, 1536), quantize(torch.randn(1536, 576), 8), kernel="int4pack")


def test_token_wise_activation_quantization():
    x = torch.randn(3, 7, 64) * torch.tensor([1.0, 10.0, 0.01]).view(3, 1, 1)
    xq = quantize_activations_per_token(x)
    step = x.abs().amax(-1, keepdim=True) / 127
    assert torch.all((xq - x).abs() <= step * (0.5 + 1e-5))
    assert torch.all(((xq / step).round() - xq / step).abs() < 1e-3)  # on each token's own 255-level grid
    lin, inp = linear_and_input(32, 64)
    qt = quantize(lin.weight, 8, 32, True)
    layer = QuantLinear(lin, qt, activation_quant="int8-token")
    expected = F.linear(quantize_activations_per_token(inp), dequantize(qt), lin.bias)
    assert torch.allclose(layer(inp), expected, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(QuantLinear(lin, qt)(inp), expected, rtol=1e-5, atol=1e-5)


# The tiny Llama's projections, named here: the reference the anatomy-driven targets are counted against.
LLAMA_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

@pytest.mark.parametrize("method", METHODS)
def test_quantized_tiny_model_generates(tiny_lm, method):
    calls = []
    group = 32 if method in ("rtn-int4", "zeroquant") else None
    model = quantize_model(tiny_lm.model, method, group, progress=lambda d, t: calls.append((d, t)))
    layers = tiny_lm.model.config.num_hidden_layers
    replaced = [m for m in model.modules() if isinstance(m, QuantLinear)]
    assert len(replaced) == len(LLAMA_LINEARS) * layers
    assert calls[-1] == (len(replaced), len(replaced)) and len(calls) == len(replaced)
    assert not any(isinstance(m, QuantLinear) for m in tiny_lm.model.modules())  # the original is untouched
    ids = torch.tensor([tiny_lm.tokenizer.encode("The capital of France")])
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=8, do_sample=False, min_new_tokens=8)
        ref = tiny_lm.model(ids).logits
        got = model(ids).logits
    assert out.shape == (1, ids.shape[1] + 8)
    assert torch.isfinite(got).all()
    assert (got - ref).abs().max() < 0.5 * ref.abs().max()  # close to the float model, not equal
    if method.startswith("rtn-int8"):
        assert (got - ref).abs().max() < 0.05 * ref.abs().max()


def test_model_weight_bytes_counts_low_bit_buffers(tiny_lm):
    model = quantize_model(tiny_lm.model, "rtn-int4", 32)
    floats = sum(p.numel() * 4 for p in tiny_lm.model.parameters())
    replaced = [(n, m) for n, m in tiny_lm.model.named_modules() if n.split(".")[-1] in LLAMA_LINEARS]
    expected = floats
    for _, lin in replaced:
        out, cols = lin.weight.shape
        expected += expected_nbytes(out, cols, 4, 32, False) - lin.weight.numel() * 4
    assert model_weight_bytes(model) == expected
    assert model_weight_bytes(tiny_lm.model) == floats


def test_quantized_lm_head(tiny_lm):
    model = quantize_model(tiny_lm.model, "rtn-int8", None, quantize_lm_head=True)
    assert isinstance(model.get_output_embeddings(), QuantLinear)
    assert isinstance(model.get_input_embeddings(), nn.Embedding)
    ids = torch.tensor([tiny_lm.tokenizer.encode("Paris")])
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=4, do_sample=False, min_new_tokens=4)
    assert out.shape[1] == ids.shape[1] + 4
    head = tiny_lm.model.get_output_embeddings().weight
    assert model_weight_bytes(model) < model_weight_bytes(quantize_model(tiny_lm.model, "rtn-int8", None))
    assert head.shape[0] * head.shape[1] * 4 > model.get_output_embeddings().nbytes


def test_unknown_method_is_rejected(tiny_lm):
    with pytest.raises(ValueError, match="unknown quantization method"):
        quantize_model(tiny_lm.model, "gptq", 32)


# --- edges that mutation testing found unguarded -------------------------------------------------------------


def test_pack_rejects_codes_just_outside_int4():
    for bad in (-9, 8):
        with pytest.raises(ValueError, match=r"\[-8, 7\]"):
            pack_int4(torch.tensor([bad], dtype=torch.int8))
    assert unpack_int4(pack_int4(torch.tensor([-8, 7], dtype=torch.int8)), 2).tolist() == [-8, 7]


@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("bits", [8, 4])
def test_zero_and_constant_groups_come_back_exactly(bits, symmetric):
    """A pruned (all-zero) row and a constant row: their scale would be 0; they get 1 and are reproduced."""
    w = weight(4, 64)
    w[1] = 0.0
    w[2] = 0.25
    qt = quantize(w, bits, 32, symmetric)
    assert torch.equal(qt.scale[1], torch.ones(2)) and torch.equal(qt.codes()[1], torch.zeros(64, dtype=torch.int8)) \
        if symmetric else torch.equal(qt.scale[1:3], torch.ones(2, 2))  # the documented scale 1
    back = dequantize(qt)
    assert torch.isfinite(back).all()
    assert torch.equal(back[1], w[1])
    if not symmetric:  # the zero point holds a constant exactly; symmetric codes hold it within half a step
        assert torch.equal(back[2], w[2])


@pytest.mark.parametrize("group", [32, 48])
def test_a_width_that_is_no_multiple_of_the_group_is_padded_up(group):
    """100 columns: groups of 32 need 28 padding columns (not 100 % 32 = 4), groups of 48 need 44."""
    w = weight(8, 100)
    qt = quantize(w, 4, group, symmetric=False)
    groups = -(-100 // group)
    assert qt.scale.shape == (8, groups) and qt.padded_in == groups * group
    back = dequantize(qt)
    assert back.shape == w.shape
    step = per_element(qt.scale, group, 100)
    assert torch.all((back - w).abs() <= step * (0.5 + 1e-5))


def test_group_size_one_is_allowed_and_zero_is_refused():
    w = weight(4, 16)
    assert torch.allclose(dequantize(quantize(w, 8, 1, symmetric=False)), w, atol=1e-4)  # each its own group
    with pytest.raises(ValueError, match="group_size must be positive"):
        quantize(w, 8, 0)


def test_bytes_of_an_odd_int4_row_round_up_to_whole_bytes():
    qt = quantize(weight(3, 5), 4, None, symmetric=False)
    assert qt.nbytes == expected_nbytes(3, 5, 4, None, False) == 3 * 3 + 3 * 8
