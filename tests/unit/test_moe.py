import pytest
import torch

from posttrainllm.moe import MoE, expert_load, load_balancing_loss, train_toy_router


def test_balancing_loss_is_one_at_even_load_and_n_experts_when_all_tokens_share_one_expert():
    even_probs = torch.full((8, 4), 0.25)
    even_choice = torch.arange(8)[:, None] % 4
    assert load_balancing_loss(even_probs, even_choice).item() == pytest.approx(1.0)
    collapsed = torch.zeros(8, 4)
    collapsed[:, 2] = 1.0
    assert load_balancing_loss(collapsed, torch.full((8, 1), 2)).item() == pytest.approx(4.0)


def test_moe_routes_each_token_to_its_top_k_experts_weighted_by_renormalised_probabilities():
    torch.manual_seed(0)
    layer = MoE(dim=6, hidden=10, n_experts=4, top_k=2)
    x = torch.randn(5, 6)
    out, aux, chosen = layer(x)
    probs = layer.router(x).softmax(-1)
    for t in range(5):
        top = probs[t].topk(2)
        expected = sum(
            g / top.values.sum() * layer.experts[e](x[t]) for g, e in zip(top.values, top.indices, strict=True)
        )
        torch.testing.assert_close(out[t], expected)
        assert set(chosen[t].tolist()) == set(top.indices.tolist())
    assert expert_load(chosen, 4).sum().item() == pytest.approx(1.0)
    aux.backward()
    assert layer.router.weight.grad.abs().sum() > 0  # the balancing loss trains the router


def test_bad_top_k_is_refused():
    with pytest.raises(ValueError, match="top_k"):
        MoE(4, 8, n_experts=3, top_k=4)


@pytest.mark.slow
def test_the_balancing_loss_evens_out_a_top1_router_that_otherwise_concentrates():
    plain, balanced = train_toy_router(0.0, top_k=1), train_toy_router(0.01, top_k=1)
    assert plain.busiest > 1.5  # the busiest expert gets half again its fair share without the loss
    assert balanced.busiest < 1.25 and balanced.aux_loss < plain.aux_loss
    assert balanced.mse < 1.1 * plain.mse  # ...at no real cost in fit
