"""Module 4: a scalar reverse-mode autograd engine.

Every arithmetic operation on a :class:`Value` returns a new ``Value`` that remembers its
inputs (``parents``) and a small ``_backward`` closure, written next to the forward math, that
applies the chain rule locally: it adds ``local derivative * out.grad`` into each parent's
``grad``. :meth:`Value.backward` visits the graph in reverse topological order so every node's
gradient is complete before it is passed on.

Two behaviours are deliberate and tested:

- **Gradients of leaves accumulate** — across the uses of a node inside one graph (a node used
  twice gets both contributions) and across calls to ``backward()``: calling it twice on the
  same loss doubles the leaves' gradients, exactly like PyTorch. Zero them between steps
  (``MLP.zero_grad()``). Gradients of intermediate nodes are recomputed from zero on each call.
- **The traversal is iterative**, with an explicit stack, so a graph 100 000 nodes deep works
  where a recursive version hits Python's recursion limit.

Bad input fails loudly: an operand that is not a number raises ``TypeError``, ``log`` of a
value <= 0 raises ``ValueError``, and no operation quietly returns NaN.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

Number = int | float


def _as_value(other: object, op: str) -> Value:
    if isinstance(other, Value):
        return other
    if isinstance(other, bool) or not isinstance(other, Number):
        raise TypeError(
            f"unsupported operand for Value {op}: {type(other).__name__} ({other!r}); "
            "use an int, a float or a Value"
        )
    return Value(other)


class Value:
    """One scalar in a computation graph, with its gradient ``d(output)/d(self)`` in ``grad``."""

    __slots__ = ("data", "grad", "parents", "op", "label", "_backward")

    def __init__(self, data: Number, parents: tuple[Value, ...] = (), op: str = "", label: str = "") -> None:
        if isinstance(data, bool) or not isinstance(data, Number):
            raise TypeError(f"Value holds an int or float, got {type(data).__name__} ({data!r})")
        if math.isnan(data):
            raise ValueError("Value(nan): a NaN would silently poison every gradient downstream")
        self.data = float(data)
        self.grad = 0.0
        self.parents = parents
        self.op = op
        self.label = label
        self._backward: Callable[[], None] = lambda: None

    def __repr__(self) -> str:
        name = f"{self.label}=" if self.label else ""
        return f"Value({name}{self.data:.4g}, grad={self.grad:.4g})"

    # --- operations: forward value and local backward rule side by side ---------------------

    def __add__(self, other: Value | Number) -> Value:
        other = _as_value(other, "+")
        out = Value(self.data + other.data, (self, other), "+")

        def _backward() -> None:
            self.grad += out.grad
            other.grad += out.grad

        out._backward = _backward
        return out

    def __mul__(self, other: Value | Number) -> Value:
        other = _as_value(other, "*")
        out = Value(self.data * other.data, (self, other), "*")

        def _backward() -> None:
            self.grad += other.data * out.grad
            other.grad += self.data * out.grad

        out._backward = _backward
        return out

    def __pow__(self, exponent: Number) -> Value:
        if isinstance(exponent, Value) or isinstance(exponent, bool) or not isinstance(exponent, Number):
            raise TypeError(f"Value ** exponent needs an int or float exponent, got {type(exponent).__name__}")
        if self.data < 0 and not float(exponent).is_integer():
            raise ValueError(f"({self.data}) ** {exponent}: a negative base with a fractional power is not real")
        if self.data == 0 and exponent < 0:
            raise ZeroDivisionError(f"0 ** {exponent}: division by zero")
        out = Value(self.data**exponent, (self,), f"**{exponent:g}")

        def _backward() -> None:
            self.grad += exponent * self.data ** (exponent - 1) * out.grad

        out._backward = _backward
        return out

    def exp(self) -> Value:
        out = Value(math.exp(self.data), (self,), "exp")  # OverflowError past ~709, never inf

        def _backward() -> None:
            self.grad += out.data * out.grad

        out._backward = _backward
        return out

    def log(self) -> Value:
        if self.data <= 0:
            raise ValueError(f"log of a non-positive value ({self.data}): the logarithm is undefined there")
        out = Value(math.log(self.data), (self,), "log")

        def _backward() -> None:
            self.grad += out.grad / self.data

        out._backward = _backward
        return out

    def tanh(self) -> Value:
        t = math.tanh(self.data)
        out = Value(t, (self,), "tanh")

        def _backward() -> None:
            self.grad += (1 - t * t) * out.grad

        out._backward = _backward
        return out

    def relu(self) -> Value:
        out = Value(self.data if self.data > 0 else 0.0, (self,), "relu")

        def _backward() -> None:
            self.grad += (out.data > 0) * out.grad

        out._backward = _backward
        return out

    def sigmoid(self) -> Value:
        # the two branches keep exp() from overflowing for large |x|
        x = self.data
        s = 1 / (1 + math.exp(-x)) if x >= 0 else math.exp(x) / (1 + math.exp(x))
        out = Value(s, (self,), "sigmoid")

        def _backward() -> None:
            self.grad += s * (1 - s) * out.grad

        out._backward = _backward
        return out

    # --- operations built from the ones above (their gradients come for free) ---------------

    def __neg__(self) -> Value:
        return self * -1

    def __sub__(self, other: Value | Number) -> Value:
        return self + (-_as_value(other, "-"))

    def __truediv__(self, other: Value | Number) -> Value:
        return self * _as_value(other, "/") ** -1

    def __radd__(self, other: Number) -> Value:
        return self + other

    def __rmul__(self, other: Number) -> Value:
        return self * other

    def __rsub__(self, other: Number) -> Value:
        return _as_value(other, "-") - self

    def __rtruediv__(self, other: Number) -> Value:
        return _as_value(other, "/") / self

    # --- the backward pass --------------------------------------------------------------------

    def topological_order(self) -> list[Value]:
        return topological_order(self)

    def backward(self) -> None:
        """Fill ``grad`` of every node with ``d(self)/d(node)``; leaves accumulate (see module doc)."""
        backpropagate(self, lambda node: 0.0)


def topological_order(root):
    """Every node ``root`` depends on, each listed after all of its ``parents``.

    An iterative depth-first search: a node is emitted when it is popped the second time, after
    its parents were pushed and emitted. No recursion, so graph depth is unlimited.
    """
    order, visited = [], set()
    stack = [(root, False)]
    while stack:
        node, parents_done = stack.pop()
        if parents_done:
            order.append(node)
        elif id(node) not in visited:
            visited.add(id(node))
            stack.append((node, True))
            stack.extend((p, False) for p in node.parents if id(p) not in visited)
    return order


def backpropagate(root, zero_like: Callable) -> None:
    """The backward pass shared by ``Value`` and ``Tensor``: reset intermediate gradients to
    ``zero_like(node)``, seed ``d(root)/d(root) = 1``, run each local rule in reverse order.
    Leaves keep what they had, so repeated calls accumulate into them."""
    order = topological_order(root)
    for node in order:
        if node.parents:
            node.grad = zero_like(node)
    root.grad += 1.0  # a leaf root accumulates like any other leaf
    for node in reversed(order):
        node._backward()


def total(values: Iterable[Value | Number]) -> Value:
    """Sum of many values as one flat chain (``sum()`` with a zero start), made of the values' own
    class: the book's ``Value``, or any class with the same arithmetic."""
    values = list(values)
    out = next((type(v) for v in values if not isinstance(v, Number)), Value)(0.0)
    for v in values:
        out = out + v
    return out


# --- drawing a graph inline -------------------------------------------------------------------


class GraphDrawing:
    """A computation graph as SVG in Jupyter, and as one text line per node everywhere else."""

    def __init__(self, root: Value) -> None:
        self.order = topological_order(root)  # not root's method: a reader's own Value may lack it
        self.names = {id(n): getattr(n, "label", "") or f"n{i}" for i, n in enumerate(self.order)}

    def _line(self, node: Value) -> str:
        name = self.names[id(node)]
        if not node.parents:
            return f"{name} = {node.data:.4g}  (grad {node.grad:.4g})"
        args = ", ".join(self.names[id(p)] for p in node.parents)
        return f"{name} = {getattr(node, 'op', '')}({args}) = {node.data:.4g}  (grad {node.grad:.4g})"

    def __repr__(self) -> str:
        return "\n".join(self._line(n) for n in self.order)

    def _repr_svg_(self) -> str:
        import html

        depth: dict[int, int] = {}
        for node in self.order:  # parents come first, so their depth is known
            depth[id(node)] = 1 + max((depth[id(p)] for p in node.parents), default=-1)
        rows: dict[int, int] = {}
        pos = {}
        for node in self.order:
            col = depth[id(node)]
            rows[col] = rows.get(col, -1) + 1
            pos[id(node)] = (20 + 190 * col, 20 + 56 * rows[col])
        width, height = 190 * (max(rows) + 1) + 20, 56 * (max(rows.values()) + 1) + 20
        parts = [
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            'font-family="monospace" font-size="11">'
        ]
        for node in self.order:
            x, y = pos[id(node)]
            for parent in node.parents:
                px, py = pos[id(parent)]
                parts.append(f'<line x1="{px + 150}" y1="{py + 18}" x2="{x}" y2="{y + 18}" stroke="#888"/>')
        for node in self.order:
            x, y = pos[id(node)]
            op = getattr(node, "op", "")
            title = self.names[id(node)] + (f" = {op}" if op else "")
            parts.append(
                f'<rect x="{x}" y="{y}" width="150" height="36" rx="6" fill="#eef4fb" stroke="#1f4e79"/>'
                f'<text x="{x + 6}" y="{y + 14}">{html.escape(title)}</text>'
                f'<text x="{x + 6}" y="{y + 29}">{node.data:.4g} | grad {node.grad:.4g}</text>'
            )
        return "".join(parts) + "</svg>"


def draw(root: Value) -> GraphDrawing:
    """``draw(loss)`` shows every node with its value and gradient, inputs on the left."""
    return GraphDrawing(root)
