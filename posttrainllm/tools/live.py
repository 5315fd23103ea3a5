"""A training-loss plot that redraws in place while the model trains.

In Jupyter the figure is displayed once and then updated through its display handle, so the
reader watches the curve grow; the saved notebook (and the book) keep the final picture.
Pass an instance as ``callback`` to :func:`posttrainllm.train.train`.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
from IPython.display import display


class LiveLoss:
    def __init__(self, title: str = "training loss", every: int = 25) -> None:
        self.title, self.every = title, every
        self.fig, self.ax = plt.subplots(figsize=(6.4, 3.2))
        plt.close(self.fig)  # shown through the handle below, not again by the inline backend
        self.handle = display(self.fig, display_id=True)

    def __call__(self, step: int, history: dict) -> None:
        """Called after each step with the history so far; redraws every ``every`` steps."""
        if (step + 1) % self.every == 0:
            self.draw(history)

    def draw(self, history: dict) -> None:
        ax = self.ax
        ax.clear()
        ax.plot(history["train"], lw=0.8, label="training batches")
        if history["val"]:
            ax.plot(*zip(*history["val"], strict=True), "o-", label="held-out")
        ax.set(xlabel="step", ylabel="cross-entropy (nats/token)", title=self.title)
        ax.legend(loc="upper right")
        self.fig.tight_layout()
        if self.handle is not None:
            self.handle.update(self.fig)
