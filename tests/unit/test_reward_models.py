"""The Bradley–Terry reward model, best-of-n's KL, and token-level distillation."""

import math

import pytest
import torch

from posttrainllm import distill, rl, sft
from posttrainllm import reward_model as rm
from posttrainllm.model import GPT, GPTConfig
from posttrainllm.preference import Pair
from posttrainllm.pretrained import Recipe, base_model

TINY = Recipe(corpus_chars=20_000, vocab_size=300, n_layer=1, n_embd=16, n_head=2, steps=5, block_size=160)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return base_model(TINY, cache_dir=tmp_path_factory.mktemp("models"))


def test_bradley_terry_loss_is_log_two_at_a_tie_and_falls_with_the_margin():
    assert rm.bradley_terry_loss(torch.zeros(3), torch.zeros(3)).item() == pytest.approx(math.log(2))
    assert rm.bradley_terry_loss(torch.tensor([2.0]), torch.tensor([0.0])).item() == pytest.approx(
        math.log1p(math.exp(-2)))


def test_reward_is_read_at_each_rows_own_end_token(tiny):
    model, tok = tiny
    reward = rm.RewardModel(model)
    idx, last = rm.encode(tok, "Where was it?", ["the hill", "a very long answer about a hill"])
    assert last.tolist() == [len(r) - 1 for r in (rm.encode(tok, "Where was it?", [t])[0][0] for t in
                                                  ("the hill", "a very long answer about a hill"))]
    torch.nn.init.normal_(reward.score.weight)
    alone = reward(*rm.encode(tok, "Where was it?", ["the hill"]))
    torch.testing.assert_close(reward(idx, last)[:1], alone)  # padding after the end token changes nothing


def test_training_separates_a_preference_the_model_can_see(tiny):
    model, tok = tiny
    pairs = [Pair(f"Question {i}?", "yes", "no") for i in range(8)]
    reward = rm.RewardModel(model)
    assert rm.pairwise_accuracy(reward, tok, pairs) == 0.0  # zero-initialised head: every pair ties
    losses = rm.train(reward, tok, pairs, steps=80, batch_size=4, lr=1e-2)
    assert losses[-1] < losses[0] / 2 and rm.pairwise_accuracy(reward, tok, pairs) == 1.0


def test_best_of_n_kl_formula():
    assert rm.best_of_n_kl(1) == 0.0
    assert rm.best_of_n_kl(4) == pytest.approx(math.log(4) - 0.75)


def test_token_kl_counts_only_response_positions():
    teacher = torch.tensor([[[2.0, 0.0], [0.0, 0.0]]])
    student = torch.tensor([[[0.0, 0.0], [5.0, -5.0]]])
    targets = torch.tensor([[1, sft.IGNORE]])
    p = torch.softmax(teacher[0, 0], -1)
    expected = (p * (p.log() - math.log(0.5))).sum()
    assert distill.token_kl(teacher, student, targets).item() == pytest.approx(expected.item())
    assert distill.token_kl(teacher, teacher, targets).item() == pytest.approx(0.0, abs=1e-7)


def test_distillation_moves_the_student_towards_the_teacher(tiny):
    teacher, tok = tiny
    student = GPT(GPTConfig(vocab_size=teacher.config.vocab_size, block_size=teacher.config.block_size,
                            n_layer=1, n_head=1, n_embd=8)).to(torch.float64)
    examples = sft.examples("questions", 8)
    before = distill.held_out_kl(student, teacher, tok, examples)
    losses = distill.train_distill(student, teacher, tok, examples, steps=40, batch_size=4, lr=1e-2)
    assert distill.held_out_kl(student, teacher, tok, examples) < before and losses[-1] < losses[0]
    other = GPT(GPTConfig(vocab_size=teacher.config.vocab_size + 1, block_size=160, n_layer=1, n_head=1, n_embd=8))
    with pytest.raises(ValueError, match="must share a vocabulary"):
        distill.train_distill(other, teacher, tok, examples, steps=1)


def test_sampled_completions_decode_for_the_reward_model(tiny):
    model, tok = tiny
    group = rl.sample_group(model, tok, "Where was it?", 3, 4, 1.0, torch.Generator().manual_seed(0))
    texts = [tok.decode([t for t in c if t != tok.special_tokens[sft.END]]) for c in group]
    idx, last = rm.encode(tok, "Where was it?", texts)
    assert idx.shape[0] == 3 and (last < idx.shape[1]).all()
