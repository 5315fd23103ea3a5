"""Module 7's exercises as a reader meets them: the skeletons in the notebook are told they are
not written yet, a reader's own attention, block, forward pass, online-softmax step and FA2 tile
pass and are recorded, each gate fails a wrong answer it has no name for, and the notebook trains
the reader's GPT once it passes. (The slips each gate names are tested in test_mastery.py.)"""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from posttrainllm.solutions import transformer as solutions
from posttrainllm.tools import mastery
from tests.conftest import ROOT
from tests.exercises import (
    assert_readers_answers_pass_and_only_they_are_recorded,
    assert_skeletons_are_not_written_yet,
    run_cells,
    run_with_answers,
)

NOTEBOOK = ROOT / "notebooks" / "07-attention.ipynb"
CALLS = {"attention": "check_attention(attention)", "self_attention": "check_self_attention(self_attention)",
         "block": "check_block(block)", "gpt_forward": "check_gpt_forward(gpt_forward)",
         "online_softmax_update": "check_online_softmax_update(update)", "flash_tile": "check_flash_tile(tile_update)",
         "fa2_memory_ratio": "check_fa2_memory_ratio(ratio"}
FUNCTIONS = {"attention": "attention", "self_attention": "self_attention", "block": "block",
             "gpt_forward": "gpt_forward", "online_softmax_update": "update", "flash_tile": "tile_update"}

# A reader's answers, written apart from the book's: the cells they type.
READER = {
    "attention": '''
def attention(q, k, v, causal=True):
    weights = torch.einsum("bhid,bhjd->bhij", q, k) * q.shape[-1] ** -0.5
    if causal:
        t = q.shape[-2]
        future = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)
        weights = weights.masked_fill(future, -torch.inf)
    return torch.softmax(weights, dim=-1) @ v


mastery.check_attention(attention)
''',
    "self_attention": '''
def self_attention(x, layer, n_head):
    b, t, c = x.shape
    qkv = layer.qkv(x).reshape(b, t, 3, n_head, c // n_head).permute(2, 0, 3, 1, 4)
    y = attention(qkv[0], qkv[1], qkv[2], causal=True)
    return layer.proj(y.permute(0, 2, 1, 3).reshape(b, t, c))


mastery.check_self_attention(self_attention)
''',
    "block": '''
def block(x, layer, n_head):
    attended = x + self_attention(layer.norm1(x), layer.attn, n_head)
    hidden = F.gelu(layer.mlp.up(layer.norm2(attended)))
    return attended + layer.mlp.proj(hidden)


mastery.check_block(block)
''',
    "gpt_forward": '''
def gpt_forward(model, idx):
    positions = torch.arange(idx.shape[-1], device=idx.device)
    x = model.tok_emb(idx) + model.pos_emb(positions)[None]
    for layer in model.blocks:
        x = block(x, layer, model.config.n_head)
    return model.head(model.norm(x))


mastery.check_gpt_forward(gpt_forward)
''',
    "online_softmax_update": '''
def update(peak, total, value):
    if value <= peak:
        return peak, total + math.exp(value - peak)
    return value, total * math.exp(peak - value) + 1.0


mastery.check_online_softmax_update(update)
''',
    "flash_tile": '''
def tile_update(peak, total, acc, s, v):
    peak_new = np.max(np.concatenate([peak[:, None], s], axis=1), axis=1)
    scale_old = np.exp(peak - peak_new)
    weights = np.exp(s - peak_new[:, None])
    return peak_new, scale_old * total + weights.sum(1), scale_old[:, None] * acc + weights @ v


mastery.check_flash_tile(tile_update)
''',
    "fa2_memory_ratio": '''
q, k, v = (rng.standard_normal((1, 1536, 64)).astype(np.float32) for _ in range(3))
ratio = extra_peak_bytes(lambda: att.attention(q, k, v, causal=True)) / extra_peak_bytes(
    lambda: att.flash_attention_forward(q, k, v, True, 64, 64))

mastery.check_fa2_memory_ratio(ratio, n=1536, block=64)
''',
}


def _run(sources: list[str]) -> dict:
    return run_cells(sources, torch=torch, np=np, math=math, F=F)


def test_each_exercise_in_the_notebook_is_a_skeleton_its_gate_calls_not_written_yet():
    assert_skeletons_are_not_written_yet(NOTEBOOK, CALLS, FUNCTIONS, _run)


def test_a_readers_own_answers_pass_are_recorded_and_the_books_are_not():
    assert_readers_answers_pass_and_only_they_are_recorded(FUNCTIONS, solutions, READER, _run)


@pytest.mark.parametrize(("gate", "old", "new"), [
    ("attention", "q.shape[-1] ** -0.5", "q.shape[-1] ** -0.4"),
    ("self_attention", "return layer.proj(", "return 0.5 * layer.proj("),
    ("block", "return attended + layer.mlp.proj(hidden)", "return attended + 0.9 * layer.mlp.proj(hidden)"),
    ("gpt_forward", "return model.head(model.norm(x))", "return model.head(model.norm(x)) * 1.1"),
    ("online_softmax_update", "total + math.exp(value - peak)", "total + 0.9 * math.exp(value - peak)"),
    ("flash_tile", "weights = np.exp(s - peak_new[:, None])", "weights = np.exp(0.9 * (s - peak_new[:, None]))"),
])
def test_a_wrong_answer_the_gate_has_no_name_for_still_fails(gate, old, new):
    sources = [READER[g] for g in FUNCTIONS][:list(FUNCTIONS).index(gate) + 1]
    sources[-1] = sources[-1].replace(old, new)
    assert old in READER[gate]
    result = getattr(mastery, f"check_{gate}")(_run(sources)[FUNCTIONS[gate]])
    assert not result and not result.first and " -- " not in repr(result), repr(result)


def test_an_online_sum_that_is_never_rescaled_is_named():
    source = READER["online_softmax_update"].replace("total * math.exp(peak - value) + 1.0", "total + 1.0")
    result = mastery.check_online_softmax_update(_run([source])["update"])
    assert not result and "rescale the running sum by exp(old max - new max)" in repr(result), repr(result)


@pytest.mark.serial
def test_the_notebook_trains_the_readers_gpt_once_it_passes():
    everything = run_with_answers(NOTEBOOK, READER, CALLS)
    assert "Your gpt_forward passed its gate: the cells below run yours." in everything
    assert "yours follows it within 1e-09" in everything
    assert "Module 7: 7 of 7 gates passed" in everything
