import copy
import random

import pytest
import torch

from posttrainllm import evals, lora, rl, sft
from posttrainllm.data import corpus
from posttrainllm.model import GPT, GPTConfig
from posttrainllm.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.train(corpus(20_000), 300, special_tokens=sft.CHAT_TOKENS)


@pytest.fixture
def policy(tok):
    model = GPT(GPTConfig(vocab_size=tok.vocab_size, block_size=128, n_layer=1, n_head=2, n_embd=32)).eval()
    return lora.inject(model, ("attn.qkv", "mlp.up"), rank=2, alpha=4)


def test_advantages_sum_to_zero_in_every_group_and_vanish_when_rewards_agree():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.2, 0.2, 0.2, 0.2], [3.0, 1.0, 2.0, 0.0]])
    for normalise in (True, False):
        adv = rl.group_advantages(rewards, normalise)
        torch.testing.assert_close(adv.sum(-1), torch.zeros(3), atol=1e-5, rtol=0)
        assert torch.all(adv[1] == 0)
    assert rl.group_advantages(rewards)[0].tolist() == pytest.approx([1, -1, -1, 1], abs=1e-4)


def test_a_group_with_identical_rewards_gives_no_gradient(tok, policy):
    prompt = sft.chat_ids(tok, "Who lost a map?")
    groups = rl.sample_group(policy, tok, "Who lost a map?", 4, 6, 1.0, torch.Generator().manual_seed(0))
    new, mask = rl.token_logprobs(policy, prompt, groups, tok.special_tokens[sft.END])
    advantages = rl.group_advantages(torch.full((1, 4), 0.7))[0]
    loss, _ = rl.grpo_loss(new, new.detach(), new.detach(), mask, advantages, kl_coef=0.0)
    loss.backward()
    assert all(p.grad is None or torch.all(p.grad == 0) for p in policy.parameters() if p.requires_grad)


def test_sampled_groups_are_well_formed(tok, policy):
    groups = rl.sample_group(policy, tok, "Where was it?", 5, 7, 1.0, torch.Generator().manual_seed(1))
    end = tok.special_tokens[sft.END]
    assert len(groups) == 5 and all(1 <= len(g) <= 7 for g in groups)
    assert all(end not in g[:-1] for g in groups)  # nothing after the end token
    assert all((rl.completion_text(tok, g) is None) == (g[-1] != end) for g in groups)


def test_with_a_large_kl_coefficient_the_policy_stays_at_the_reference(tok, policy):
    reference = copy.deepcopy(policy).eval()
    prompts = sft.examples("questions", 8)

    noise = random.Random(0)

    def reward(example, completion):  # random rewards: every group has something to push on
        return evals.composite_reward(completion, example.response) + noise.random()

    history = rl.train_grpo(policy, reference, tok, prompts, reward, steps=3, prompts_per_step=4, group_size=4,
                            lr=1e-2, kl_coef=1e4, max_tokens=6)
    assert max(history["kl"]) < 1e-3
    free = copy.deepcopy(reference)
    lora.set_adapter(free, "default")
    loose = rl.train_grpo(free, reference, tok, prompts, reward, steps=3, prompts_per_step=4, group_size=4,
                          lr=1e-2, kl_coef=0.0, max_tokens=6)
    assert loose["kl"][-1] > 10 * max(history["kl"][-1], 1e-6)


def test_a_reproducible_start_rounds_away_differences_far_below_its_grid(policy):
    policy.eval()
    nudged = copy.deepcopy(policy)
    with torch.no_grad():  # what another CPU's rounding leaves after training: 1e-9 on every weight
        for p in nudged.parameters():
            p.add_(1e-9 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    a, b = rl.reproducible_start(policy), rl.reproducible_start(nudged)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))
    for (name, p), q in zip(policy.named_parameters(), a.parameters(), strict=True):
        grid = 2.0**-8 if p.requires_grad else 2.0**-12
        assert q.dtype == torch.float64 and p.dtype == torch.float32  # a copy; the model is untouched
        assert torch.equal(torch.round(q / grid) * grid, q), name
        assert (q - p.double()).abs().max() <= grid / 2, name


# --- the aggregation is a named choice -----------------------------------------------------------

UNEQUAL = torch.tensor([[1.0, 2.0, 3.0, 4.0], [10.0, 0.0, 0.0, 0.0]])  # a 4-token and a 1-token response
UNEQUAL_MASK = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 0.0, 0.0, 0.0]])


def test_the_three_aggregations_weigh_long_and_short_responses_as_their_papers_say():
    token = rl.aggregate(UNEQUAL, UNEQUAL_MASK, "token")
    sequence = rl.aggregate(UNEQUAL, UNEQUAL_MASK, "sequence")
    constant = rl.aggregate(UNEQUAL, UNEQUAL_MASK, "constant", max_tokens=8)
    assert token.item() == pytest.approx((1 + 2 + 3 + 4 + 10) / 5)  # every token the same weight
    assert sequence.item() == pytest.approx((2.5 + 10) / 2)  # every response the same weight
    assert constant.item() == pytest.approx(20 / (2 * 8))  # a constant that no length moves
    # with equal lengths the first two agree, and the third is the same up to the fixed factor
    equal = torch.ones_like(UNEQUAL_MASK)
    assert rl.aggregate(UNEQUAL, equal, "token") == pytest.approx(rl.aggregate(UNEQUAL, equal, "sequence").item())
    assert rl.aggregate(UNEQUAL, equal, "constant", 4) == pytest.approx(rl.aggregate(UNEQUAL, equal, "token").item())


def test_a_short_responses_tokens_weigh_more_under_the_per_response_mean():
    weights = {}
    for how in rl.AGGREGATIONS:
        values = UNEQUAL.clone().requires_grad_(True)
        rl.aggregate(values, UNEQUAL_MASK, how, max_tokens=8).backward()
        weights[how] = (values.grad[0, 0].item(), values.grad[1, 0].item())  # a long and a short response's token
    assert weights["token"] == pytest.approx((1 / 5, 1 / 5))
    assert weights["sequence"] == pytest.approx((1 / 8, 1 / 2))
    assert weights["constant"] == pytest.approx((1 / 16, 1 / 16))


def test_the_default_aggregation_is_the_token_mean_the_books_models_were_trained_with(tok, policy):
    prompt = sft.chat_ids(tok, "Who lost a map?")
    groups = rl.sample_group(policy, tok, "Who lost a map?", 4, 6, 1.0, torch.Generator().manual_seed(3))
    new, mask = rl.token_logprobs(policy, prompt, groups, tok.special_tokens[sft.END])
    old, ref, adv = new.detach() - 0.05, new.detach() + 0.1, torch.tensor([1.0, -0.5, 0.2, -0.7])
    loss, kl = rl.grpo_loss(new, old, ref, mask, adv)
    ratio = torch.exp(new - old)
    objective = torch.minimum(ratio * adv[:, None], torch.clamp(ratio, 0.8, 1.2) * adv[:, None])
    k3 = torch.exp(ref - new) - (ref - new) - 1
    assert torch.equal(loss, -((objective - 0.04 * k3) * mask).sum() / mask.sum())
    assert torch.equal(kl, (k3 * mask).sum().detach() / mask.sum())
    assert rl.grpo_loss(new, old, ref, mask, adv, aggregation="sequence")[0] != loss


@pytest.mark.parametrize(("values", "mask", "how", "max_tokens", "message"), [
    (UNEQUAL, UNEQUAL_MASK[:, :3], "token", None, r"values of shape \(2, 4\) and a mask of shape \(2, 3\)"),
    (UNEQUAL, torch.zeros_like(UNEQUAL_MASK), "token", None, "the mask selects no token"),
    (UNEQUAL, torch.tensor([[1.0, 1, 0, 0], [0, 0, 0, 0]]), "sequence", None, "an empty response has no mean"),
    (UNEQUAL, UNEQUAL_MASK, "constant", None, "give max_tokens >= 4"),
    (UNEQUAL, UNEQUAL_MASK, "constant", 3, "give max_tokens >= 4"),
    (UNEQUAL, UNEQUAL_MASK, "mean", None, "aggregation must be one of"),
])
def test_bad_aggregation_input_is_named(values, mask, how, max_tokens, message):
    with pytest.raises(ValueError, match=message):
        rl.aggregate(values, mask, how, max_tokens)


def test_train_grpo_refuses_an_unknown_aggregation_before_sampling(tok, policy):
    with pytest.raises(ValueError, match="aggregation must be one of"):
        rl.train_grpo(policy, policy, tok, sft.examples("questions", 2), rl.composite, steps=1, aggregation="dapo")


def test_population_std_is_the_groups_own_spread():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0]])
    population = rl.group_advantages(rewards, eps=0.0)
    sample = (rewards - rewards.mean()) / rewards.std()  # torch's default: divide by G - 1
    assert torch.allclose(sample / population, torch.full((1, 4), (3 / 4) ** 0.5))


def test_token_entropy_is_log_vocab_for_uniform_logits_and_zero_for_a_certain_one():
    logits = torch.stack([torch.zeros(5), torch.tensor([0.0, 0.0, 1e4, 0.0, 0.0])])
    entropy = rl.token_entropy(logits)
    assert entropy[0].item() == pytest.approx(torch.log(torch.tensor(5.0)).item()) and entropy[1].item() == 0.0


def test_each_rung_of_the_ladder_is_blind_to_what_its_advantage_removes(tok, policy):
    """The same sampled answers, scored by r and by 3r + 5: REINFORCE's gradient changes with both
    the scale and the shift; with the group's mean as baseline only the scale remains (x3); divided
    by the group's std too, neither does."""
    prompts = sft.examples("questions", 8)
    noise = random.Random()

    def reward(example, completion):  # random, so that every group has something to push on
        return noise.random()

    def shifted(example, completion):
        return 3 * reward(example, completion) + 5

    kinds = {"raw": rl.raw_rewards, "centred": rl.centred, "normalised": rl.group_advantages}
    noise.seed(0)  # the same scores, in the same order, for the same sampled answers
    plain = rl.policy_gradients(policy, tok, prompts, reward, kinds, draws=2, prompts_per_step=2, group_size=4,
                                max_tokens=6)
    noise.seed(0)
    moved = rl.policy_gradients(policy, tok, prompts, shifted, kinds, draws=2, prompts_per_step=2, group_size=4,
                                max_tokens=6)
    assert plain["raw"].shape[0] == 2 and plain["raw"].abs().sum() > 0
    torch.testing.assert_close(moved["centred"], 3 * plain["centred"])
    torch.testing.assert_close(moved["normalised"], plain["normalised"], rtol=1e-4, atol=1e-6)  # eps in the std
    assert not torch.allclose(moved["raw"], 3 * plain["raw"])


def test_gradient_noise_is_the_spread_over_the_shared_signal():
    assert rl.gradient_noise(torch.tensor([[1.0, 0.0], [3.0, 0.0]])) == pytest.approx(0.25)  # distances 1, mean 2
    with pytest.raises(ValueError, match="at least two estimates"):
        rl.gradient_noise(torch.ones(1, 3))


@pytest.mark.parametrize("rung", list(rl.LADDER))
def test_every_rung_of_the_ladder_trains(tok, policy, rung):
    reference = copy.deepcopy(policy).eval()
    history = rl.train_grpo(policy, reference, tok, sft.examples("questions", 8), rl.composite, steps=1,
                            prompts_per_step=2, group_size=4, max_tokens=6, **rl.LADDER[rung])
    assert len(history["reward"]) == 1
