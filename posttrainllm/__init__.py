"""posttrainllm: the shared package behind the book.

Each module holds one concept, named after it, in the order the curriculum meets them
(tests/unit/test_package.py checks that this map names every module, and nothing else):

- module 1  ``linear``            a linear model, mean squared error, least squares
- module 2  ``gradient_descent``  numerical gradients, GD, SGD, momentum
- module 3  ``matmul``            FLOPs, bytes, roofline; a counted model of tiled matmul
            ``precision``         fp16 as a number format, rounding in sums, underflow
            ``webgpu``            the book's WGSL kernels, read, checked and run through wgpu-py
- module 4  ``autograd``          a scalar reverse-mode autograd (``Value``)
            ``nn``                neurons, layers and an MLP over ``Value``
            ``tensor``            the same autograd on numpy arrays
            ``toydata``           two moons and other 2-D sets
- module 5  ``data``              the built-in story corpus, loaders, splits, batches
            ``device``            choosing CPU / CUDA / MPS in one place
            ``chars``             a character vocabulary
            ``ngram``             the count-based bigram language model
            ``char_mlp``          a neural character language model
            ``sampling``          greedy, temperature, top-k, top-p, and a chi-square check
            ``scaling``           power-law fits and the compute frontier
- module 6  ``tokenizer``         byte-level BPE: train, encode, stream, save, load
            ``bpe_ranks``         tiktoken rank tables read offline, rebuilt as merges
            ``embeddings``        nearest neighbours, position encodings
- module 7  ``attention``         attention, multi-head, online softmax, FlashAttention-2
            ``model``             the oracle GPT (config, norms, RoPE, blocks, weight export)
            ``train``             training, evaluation, generation, safe checkpoints
            ``measure``           timing and peak memory measured the same way everywhere
            ``wasm``              the tiny-GPT trainer in WebAssembly, checked against the oracle
            ``pretrained``        the cached base model that modules 8–10 start from
- module 8  ``optim``             SGD with momentum, Adam, AdamW; schedules and clipping
            ``mixed_precision``   fp16 training with master weights and loss scaling
            ``checkpointing``     gradient checkpointing and activation memory
            ``distributed``       data-parallel training on torch.distributed
            ``pretrain``          the torchrun trainer: DDP or FSDP2, resumable DCP checkpoints
            ``fused_cross_entropy`` the output head and its loss in one step, no logits kept
- module 9  ``lora``              low-rank adapters on a frozen model
            ``tuned``             module 9's fine-tuned models (SFT, LoRA, DPO), cached
            ``sft``               supervised fine-tuning: chat format, loss masking, packing
            ``preference``        preference tuning with DPO
- module 10 ``evals``             held-out loss, perplexity, verifiable rewards, memorisation
            ``rl``                GRPO from verifiable rewards
            ``comparison``        intervals and paired tests for comparing models
            ``continual``         improving a deployed model from its own usage
            ``logit_lens``        what the model would predict at each depth
            ``sae``               a sparse autoencoder on the residual stream
            ``speculative``       speculative decoding
- reference ``moe``               a mixture of experts and its load-balancing loss
            ``zero``              ZeRO's memory count, checked on DDP, ZeRO-1 and FSDP2 processes
            ``simulated_precision`` bf16, fp16 and fp8 training simulated on the CPU
            ``dedup``             exact and MinHash-LSH near-duplicate removal
            ``quality``           heuristic quality rules for text
            ``contamination``     n-gram overlap between evaluation items and training data
            ``curation``          module 9's data with planted faults, cleaned stage by stage
            ``reward_model``      a Bradley–Terry reward model; best-of-n
            ``distill``           token-level distillation into a smaller model
            ``roofline``          a device's roofline, measured
            ``paged_kv``          a paged KV-cache allocator against contiguous reservation
            ``batching``          static against continuous batching, simulated
            ``quantize``          int8 and int4 weight quantization
            ``failures``          an error taxonomy for the question-answering task
            ``eval_report``       the eval matrix of the book's models, and model cards
            ``induction``         induction heads in an attention-only model; patching, ablation

Around them: ``assets`` (the kernels and the WASM trainer, shipped as package data),
``atomic`` (files written whole or not at all), ``progress`` (the training loops' bars, shown
when someone waits on them), the book's tooling in ``tools``, and in ``solutions`` the book's
answers to the exercises, one module per notebook.

Imports here stay light (no torch) so ``import posttrainllm`` is instant everywhere.
"""

import importlib.abc
import sys

__version__ = "0.1.0"  # the one place it is written: pyproject.toml reads it from here


class _MissingTorch(importlib.abc.MetaPathFinder):
    """Consulted last, so only when no installed package provides ``torch``: turns the bare
    ``No module named 'torch'`` of modules 5-10 into the command that fixes it. Only an ``import``
    written in this package gets the message; anyone else (``importlib.util.find_spec("torch")``,
    another library's optional import) sees the usual ``None``."""

    def find_spec(self, name, path=None, target=None):
        if name == "torch" and _importer(sys._getframe(1)).startswith("posttrainllm"):
            raise ModuleNotFoundError(
                "PyTorch is not installed, and posttrainllm's modules from 5 on need it: "
                "pip install 'posttrainllm[torch]' (or, in a clone of the book, make install)",
                name="torch",
            )
        return None


def _importer(frame) -> str:
    """The module whose code asked for the import: the first frame outside the import system."""
    while frame is not None and frame.f_code.co_filename.startswith("<frozen importlib"):
        frame = frame.f_back
    return str(frame.f_globals.get("__name__", "")) if frame is not None else ""


if not any(isinstance(finder, _MissingTorch) for finder in sys.meta_path):
    sys.meta_path.append(_MissingTorch())
