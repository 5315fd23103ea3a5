"""The book's answers to the exercises, one module per notebook (``backprop`` for module 4).

A notebook imports its module as ``solutions`` and shows an answer, folded, only after the
exercise that asks for it; the reader's own function keeps its name, so Run All never replaces
it. A gate passed by one of these is not added to the reader's record.
"""
