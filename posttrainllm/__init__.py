"""posttrainllm: the shared package behind the book.

Each module holds one concept, named after it, in the order the curriculum meets them:

- ``linear``            module 1: a linear model, mean squared error, least squares
- ``gradient_descent``  module 2: numerical gradients, GD, SGD, momentum
- ``study``             the study queue (``book/study-queue.md``): read, fill, check
- ``coverage``          which notebook section teaches which package module or kernel
- ``mastery``           the exercise gates at the end of each notebook
- ``source``            show a package function's source inside a notebook

Imports here stay light (no torch) so ``import posttrainllm`` is instant everywhere.
"""

__version__ = "0.1.0"
