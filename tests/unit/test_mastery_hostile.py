"""Every mastery gate against hostile answers: objects that lie about equality, shape or truth,
conversions that raise, numbers too large for a float, functions that never return. Each must
come back as a NOT YET report, never an exception, a hang or a PASSED."""

import time

import numpy as np
import pytest
import torch

from posttrainllm.autograd import Value
from posttrainllm.tools import mastery


class Liar:
    """Equal to everything, true of nothing it is asked, and an array that calls itself close."""

    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False

    __hash__ = object.__hash__

    def __bool__(self):
        raise RuntimeError("no truth value")

    def __iter__(self):
        raise RuntimeError("no items")

    def __len__(self):
        raise RuntimeError("no length")

    def __float__(self):
        raise RuntimeError("no float")

    def __index__(self):
        raise RuntimeError("no index")

    def __array_function__(self, func, types, args, kwargs):
        return True  # np.allclose(liar, anything) -> True


class LyingTensor(torch.Tensor):
    """A one-element tensor whose shape equals every shape."""

    @property
    def shape(self):
        return Liar()


def lying_tensor():
    return torch.zeros(1).as_subclass(LyingTensor)


HOSTILE = {
    "None": lambda: None,
    "a string": lambda: "text",
    "a liar": Liar,
    "a pair of liars": lambda: (Liar(), Liar()),
    "10**400": lambda: 10**400,
    "a lying tensor": lying_tensor,
    "an int subclass equal to all": lambda: type("EqualInt", (int,), {"__eq__": lambda s, o: True,
                                                                      "__ne__": lambda s, o: False})(7),
}

# the find-out gates and module 10's expected_tokens take more than the answer: what a notebook passes
CONTEXT = {
    "check_lowest_loss": (np.arange(5.0), np.array([0.0, 3.0, 1.0, 4.0, 2.0])),
    "check_divergence_lr": (np.arange(5.0), 0.9),
    "check_best_tile": (96, 80, 64, 50_000),
    "check_graph_size": (Value(2.0) * Value(3.0),),
    "check_temperature": (np.array([2.0, 1.0, 0.5, -1.0]), 1.5),
    "check_compression": ("the fox ran to the mill " * 40, "the fox sat by the mill " * 10, 270),
    "check_fa2_memory_ratio": (256, 32),
    "check_max_loss_scale": (np.array([1e-3, 2.0, -30.0]),),
    "check_energy_rank": (np.eye(4)[:3], 0.9),
    "check_alpha_for": (4, 3.0),
}


def _run(gate: str, answer):
    fn = getattr(mastery, gate)
    if mastery.GATES[gate][1] == mastery.FIND:
        return fn(answer, *CONTEXT[gate])
    return fn(lambda *args, **kwargs: answer)


@pytest.mark.parametrize("gate", sorted(mastery.GATES))
@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_a_hostile_answer_gets_not_yet(gate, kind):
    result = _run(gate, HOSTILE[kind]())
    assert isinstance(result, mastery.GateResult), type(result)
    assert not result.passed and repr(result).startswith("NOT YET"), repr(result)


@pytest.mark.parametrize("gate", ["check_fit_line", "check_encode", "check_attention"])
def test_a_function_that_never_returns_is_stopped(gate, monkeypatch):
    monkeypatch.setattr(mastery, "GATE_SECONDS", 1)

    def forever(*args, **kwargs):
        while True:
            time.sleep(0.01)

    started = time.monotonic()
    result = getattr(mastery, gate)(forever)
    assert not result.passed and "stopped after 1 s" in repr(result)
    assert time.monotonic() - started < 30


def test_plain_turns_pretenders_into_what_they_claim_to_be():
    assert type(mastery.plain(HOSTILE["an int subclass equal to all"]())) is int
    assert mastery.plain(lying_tensor()).shape == (1,)
    assert mastery.plain((np.float32(1.5), [np.int64(2)])) == (1.5, [2])
    assert isinstance(mastery.plain(Liar()), np.ndarray)  # an array-like is asked for its data, as numpy would
