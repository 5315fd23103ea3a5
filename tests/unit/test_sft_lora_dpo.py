import math

import pytest
import torch

from posttrainllm import lora, preference, sft
from posttrainllm.data import corpus
from posttrainllm.model import GPT, GPTConfig
from posttrainllm.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.train(corpus(20_000), 300, special_tokens=sft.CHAT_TOKENS)


@pytest.fixture
def model(tok):
    return GPT(GPTConfig(vocab_size=tok.vocab_size, block_size=128, n_layer=2, n_head=2, n_embd=32)).eval()


TARGETS = ("attn.qkv", "attn.proj", "mlp.up", "mlp.proj")


def test_tasks_have_exact_answers_and_test_splits_share_no_name_pair_with_training():
    train, test = sft.examples("questions", 60), sft.examples("questions", 30, split="test")
    assert all(e.response in e.prompt for e in train) and not {e.prompt for e in train} & {e.prompt for e in test}
    style_train, style_test = sft.examples("storybook", 200), sft.examples("storybook", 40, split="test")
    assert all(e.response.startswith("Whereupon") and "gave thanks" in e.response for e in style_train)
    names = lambda e: tuple(e.prompt.removeprefix("Tell it the old way: ").split()[::4])  # noqa: E731
    assert not {names(e) for e in style_train} & {names(e) for e in style_test}
    with pytest.raises(ValueError, match="task must be one of"):
        sft.examples("poetry", 1)
    with pytest.raises(ValueError, match="split must be one of"):
        sft.examples("questions", 1, split="validation")


def test_rendering_masks_the_prompt_and_trains_the_response_and_its_end(tok):
    example = sft.Example("Who lost a map?", "Ada", "questions")
    inputs, targets = sft.render(tok, example)
    prompt = sft.chat_ids(tok, example.prompt)
    assert inputs[: len(prompt)] == prompt and len(inputs) == len(targets)
    trained = [t for t in targets if t != sft.IGNORE]
    assert trained == tok.encode_ordinary("Ada") + [tok.special_tokens[sft.END]]
    assert targets[: len(prompt) - 1] == [sft.IGNORE] * (len(prompt) - 1)


def test_changing_a_prompt_tokens_target_does_not_change_the_sft_loss(tok, model):
    inputs, targets = sft.pack([sft.render(tok, e) for e in sft.examples("questions", 3)], 128,
                               tok.special_tokens[sft.END])
    _, loss = model(inputs, targets)
    prompt_positions = (targets == sft.IGNORE).nonzero()
    raw = targets.clone()
    raw[tuple(prompt_positions[0])] = 7  # what an unmasked prompt position would have been trained on
    assert not torch.equal(raw, targets)
    masked = torch.where(targets == sft.IGNORE, sft.IGNORE, targets)
    assert model(inputs, masked)[1].item() == loss.item()
    assert model(inputs, raw)[1].item() != loss.item()


def test_packing_keeps_examples_whole_and_pads_with_ignored_targets(tok):
    rendered = [sft.render(tok, e) for e in sft.examples("questions", 5)]
    inputs, targets = sft.pack(rendered, 128, tok.special_tokens[sft.END])
    assert inputs.shape[1] == 128 and inputs.shape[0] < 5  # several examples per row
    assert (targets != sft.IGNORE).sum() == sum(sum(t != sft.IGNORE for t in r[1]) for r in rendered)
    with pytest.raises(ValueError, match="does not fit"):
        sft.pack(rendered, 8, 0)


def test_chat_needs_the_chat_tokens():
    plain = Tokenizer.train(corpus(5_000), 280)
    with pytest.raises(ValueError, match="chat tokens"):
        sft.chat_ids(plain, "hello")


def test_a_fresh_adapter_changes_nothing_and_only_a_and_b_train(tok, model):
    idx = torch.randint(0, tok.vocab_size, (2, 20), generator=torch.Generator().manual_seed(0))
    before = model(idx)
    base_weights = {k: v.clone() for k, v in model.state_dict().items()}
    lora.inject(model, TARGETS, rank=4, alpha=8)
    torch.testing.assert_close(model(idx), before, atol=0, rtol=0)  # B = 0
    names = {n for n, p in model.named_parameters() if p.requires_grad}
    assert names and all(n.endswith((".A.default", ".B.default")) for n in names)
    sft.train_sft(model, tok, sft.examples("questions", 20), steps=5, lr=1e-2)
    after = model.state_dict()
    for key, value in base_weights.items():
        wrapped = key.replace(".weight", ".base.weight").replace(".bias", ".base.bias")
        assert torch.equal(after.get(key, after.get(wrapped)), value), key  # the base is bit-identical
    assert not torch.allclose(model(idx), before)  # ...and the adapter learned something


def test_merged_and_unmerged_models_give_the_same_logits(tok, model):
    lora.inject(model, TARGETS, rank=3)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.normal_(0, 0.1)
    idx = torch.randint(0, tok.vocab_size, (2, 16), generator=torch.Generator().manual_seed(1))
    unmerged = model(idx)
    lora.merge(model)
    torch.testing.assert_close(model(idx), unmerged, atol=1e-5, rtol=1e-5)
    lora.unmerge(model)
    torch.testing.assert_close(model(idx), unmerged, atol=1e-5, rtol=1e-5)


def test_trainable_count_matches_the_lora_formula(model):
    d, n_layer, r = 32, 2, 4
    lora.inject(model, ("attn.proj",), rank=r)  # square d x d: 2 * L_hat * d * r
    assert lora.trainable_parameters(model) == 2 * n_layer * d * r
    lora.inject(model, ("attn.qkv", "mlp.up"), rank=r, name="wide")  # d -> 3d and d -> 4d
    per_layer = lora.lora_parameters(d, 3 * d, r) + lora.lora_parameters(d, 4 * d, r)
    assert lora.trainable_parameters(model) == n_layer * per_layer
    assert round(lora.lora_parameters(12288, 12288, 1) * 2 * 96 / 1e6, 1) == 4.7  # GPT-3, Wq and Wv, r = 1
    assert round(lora.lora_parameters(12288, 12288, 8) * 2 * 96 / 1e6, 1) == 37.7


def test_adapters_save_alone_load_back_and_switch_on_one_base(tok, model, tmp_path):
    idx = torch.randint(0, tok.vocab_size, (1, 12), generator=torch.Generator().manual_seed(2))
    base_logits = model(idx)
    lora.inject(model, TARGETS, rank=2, name="one", seed=1)
    lora.inject(model, TARGETS, rank=2, name="two", seed=2)
    for name in ("one", "two"):
        lora.set_adapter(model, name)
        with torch.no_grad():
            for p in model.parameters():
                if p.requires_grad:
                    p.normal_(0, 0.2)
    logits_two = model(idx)
    lora.save_adapter(model, tmp_path / "two.pt")
    lora.set_adapter(model, "one")
    assert not torch.allclose(model(idx), logits_two)
    lora.set_adapter(model, None)
    torch.testing.assert_close(model(idx), base_logits)
    fresh = lora.inject(GPT(model.config).eval(), TARGETS, rank=2, name="scratch")
    assert lora.load_adapter(fresh, tmp_path / "two.pt") == "two"
    torch.testing.assert_close(fresh(idx), logits_two)
    assert (tmp_path / "two.pt").stat().st_size < sum(p.numel() * 4 for p in model.parameters()) / 5


def test_damaged_or_foreign_adapter_files_are_refused(tok, model, tmp_path):
    lora.inject(model, TARGETS, rank=2)
    lora.save_adapter(model, tmp_path / "a.pt")
    data = (tmp_path / "a.pt").read_bytes()
    (tmp_path / "cut.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="truncated or corrupt"):
        lora.load_adapter(model, tmp_path / "cut.pt")
    torch.save({"hello": 1}, tmp_path / "foreign.pt")
    with pytest.raises(ValueError, match="not a posttrainllm LoRA adapter"):
        lora.load_adapter(model, tmp_path / "foreign.pt")
    other = lora.inject(GPT(model.config).eval(), ("attn.proj",), rank=2)
    with pytest.raises(ValueError, match="adapts layers"):
        lora.load_adapter(other, tmp_path / "a.pt")
    with pytest.raises(ValueError, match="no adapter named"):
        lora.set_adapter(model, "missing")


def test_dpo_on_identical_responses_is_log_two_and_its_gradient_widens_the_margin(tok, model):
    same = torch.tensor([-3.0, -5.0])
    loss, margin = preference.dpo_loss(same, same, same, same)
    assert loss.item() == pytest.approx(math.log(2)) and torch.all(margin == 0)
    reference = GPT(model.config).eval()
    reference.load_state_dict(model.state_dict())
    pairs = preference.contrast_pairs(sft.examples("questions", 12))
    assert pairs and all(p.chosen != p.rejected for p in pairs)
    history = preference.train_dpo(model, reference, tok, pairs, steps=8, batch_size=8, lr=3e-3, beta=0.5)
    assert history["loss"][0] == pytest.approx(math.log(2), abs=1e-6)  # policy starts as the reference
    assert history["margin"][-1] > history["margin"][0] and history["loss"][-1] < history["loss"][0]
    assert preference.preference_accuracy(model, tok, pairs) > preference.preference_accuracy(reference, tok, pairs)


def test_style_score_tells_the_registers_apart():
    score = sft.StyleScore(n_chars=40_000)
    assert score.score("Whereupon Ivy gave thanks to Mira with a glad heart.") > 0.9
    assert score.score("Ivy smiled and thanked Mira.") < 0.1


def test_lora_forward_gate_passes_the_formula_and_catches_a_missing_scale():
    import numpy as np

    from posttrainllm.tools import mastery

    def right(x, w, b, a, bb, alpha, r):
        return x @ w.T + b + (alpha / r) * (x @ a.T) @ bb.T

    def unscaled(x, w, b, a, bb, alpha, r):
        return x @ w.T + b + (x @ a.T) @ bb.T

    assert mastery.check_lora_forward(right)
    assert len(mastery.check_lora_forward(unscaled).failures) == 2  # scale is 1 only when alpha = r or B = 0
    assert "shape" in repr(mastery.check_lora_forward(lambda x, *rest: np.zeros(2)))


def test_the_gate_formula_is_what_lora_linear_computes():
    layer = torch.nn.Linear(5, 3)
    wrapped = lora.LoRALinear(layer)
    wrapped.add("x", rank=2, alpha=6.0, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        wrapped.B["x"].normal_()
    wrapped.active = "x"
    x = torch.randn(4, 5)
    a, b = wrapped.A["x"], wrapped.B["x"]
    torch.testing.assert_close(wrapped(x), x @ layer.weight.T + layer.bias + 3.0 * (x @ a.T) @ b.T)


def test_feedback_log_keeps_corrections_and_names_a_damaged_line(tmp_path):
    from posttrainllm.continual import Correction, FeedbackLog

    log = FeedbackLog(tmp_path / "usage" / "corrections.jsonl")
    assert log.corrections() == []
    log.append(Correction("Who lost a map?", "Mira", "Ada"))
    log.append(Correction("Where was it?", "the hill", "the cave"))
    assert [c.correct for c in log.corrections()] == ["Ada", "the cave"]
    with log.path.open("a") as f:
        f.write('{"prompt": "half a line\n')
    with pytest.raises(ValueError, match="line 3"):
        log.corrections()


@pytest.mark.slow
def test_serving_logs_every_wrong_answer_and_a_refresh_trains_a_new_adapter_on_them(tok, model, tmp_path):
    from posttrainllm import continual

    lora.inject(model, TARGETS, rank=2, name="v0")
    log = continual.FeedbackLog(tmp_path / "log.jsonl")
    requests = sft.examples("questions", 6)
    accuracy = continual.serve(model, tok, requests, log)
    assert len(log.corrections()) == round((1 - accuracy) * 6) and accuracy < 1
    frozen = {n: p.clone() for n, p in model.named_parameters() if ".base." in n}
    continual.refresh(model, tok, log, replay=requests[:2], name="v1", targets=TARGETS, rank=2, steps=5)
    assert {m.active for m in model.modules() if isinstance(m, lora.LoRALinear)} == {"v1"}
    assert all(torch.equal(p, frozen[n]) for n, p in model.named_parameters() if n in frozen)


def test_graded_replies_are_the_right_answers_and_a_missing_reply_is_named():
    questions = sft.examples("questions", 3)
    replies = [f" {questions[0].response} ", "wrong", questions[2].response]
    assert sft.graded(replies, questions).tolist() == [True, False, True]
    with pytest.raises(ValueError, match="2 replies for 3 examples"):
        sft.graded(replies[:2], questions)
