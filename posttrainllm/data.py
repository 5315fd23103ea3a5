"""The corpus every notebook trains on, built into the package, plus loaders and batching.

Tests and builds have no network, so the text is *generated*: short stories from a small
grammar with recurring characters, places and objects. Each story exists in two registers —
``"plain"`` (short, simple sentences) and ``"storybook"`` (the same events told in an older,
more ornate voice) — so modules 9–10 can teach a model a style and test whether it learned the
style or memorised the text. The same ``(seed, index)`` always gives the same story, in either
register: its *content* comes from one seeded generator, its *wording* from another.

For readers with a network, :func:`load_text` fetches a public corpus (Tiny Shakespeare,
TinyStories) once into a local cache.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import tempfile
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from posttrainllm import atomic

REGISTERS = ("plain", "storybook")

TINY_SHAKESPEARE_URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
TINYSTORIES_VALID_URL = (
    "https://huggingface.co/datasets/roneneldan/TinyStories/resolve/main/TinyStories-valid.txt"
)

NAMES = ["Mira", "Tobin", "Ada", "Pell", "Juniper", "Oskar", "Lena", "Rafe", "Ivy", "Bram", "Nell", "Corin"]
KINDS = ["fox", "girl", "boy", "badger", "old sailor", "baker", "owl", "miller", "goat", "weaver", "heron", "tinker"]
TRAITS = ["brave", "curious", "shy", "clever", "gentle", "stubborn", "cheerful", "careful", "restless", "kind"]
PLACES = [
    ("the mill by the river", "the old mill where the river runs slow"),
    ("the hill", "the green hill above the village"),
    ("the harbour", "the grey harbour where the boats sleep"),
    ("the forest", "the deep forest of tall pines"),
    ("the market", "the busy market square"),
    ("the lighthouse", "the white lighthouse on the rocks"),
    ("the garden", "the walled garden behind the inn"),
    ("the bridge", "the stone bridge over the brook"),
    ("the meadow", "the wide meadow full of clover"),
    ("the cave", "the cold cave under the cliff"),
]
OBJECTS = [
    "a brass key", "a blue kite", "a map", "a lantern", "a wooden flute", "a red apple", "a silver bell",
    "a book of songs", "a warm scarf", "a jar of honey", "a compass", "a little boat",
]
WEATHER = ["the sun was warm", "rain was falling", "the wind was cold", "fog lay on the water", "snow was coming"]
PROBLEMS = [
    ("lost", "had lost"),
    ("broke", "had broken"),
    ("forgot", "had forgotten"),
    ("dropped", "had dropped"),
]
FEELINGS = ["happy", "tired", "proud", "worried", "hungry", "sleepy", "glad"]
MORALS = [
    ("It is better to ask for help.", "Thus it was learned that no one need carry a burden alone."),
    ("Small things matter.", "And so it was shown that small things may matter a great deal."),
    ("Friends make the road short.", "For it is ever true that good company shortens the longest road."),
    ("Patience pays.", "And patience, as it so often does, was rewarded in the end."),
]


# Village names are coined from syllables, so the vocabulary keeps growing with the corpus
# (as real text does) and a tokenizer has sub-words to discover: "Brackenmoor", "Ashford"...
ONSETS = ["Ash", "Brack", "Cran", "Dun", "El", "Fen", "Gar", "Hol", "Ivy", "Kel", "Lark", "Mor", "Nor",
          "Oak", "Pen", "Quill", "Ros", "Stan", "Thorn", "Ul", "Wen", "Yar"]
MIDDLES = ["", "", "en", "er", "il", "ow", "a", "ing", "am", "or", "ith", "el"]
CODAS = ["ford", "moor", "by", "wick", "ton", "dale", "mere", "stead", "holm", "gate", "well", "brook"]


# Travellers met on the road get coined given names too: "Marabel", "Tovric", ...
NAME_STARTS = ["Ma", "To", "El", "Bri", "Ca", "Do", "Fe", "Gi", "Ha", "Jo", "Ke", "Li", "No", "Pa", "Ro", "Sa",
               "Te", "Vi", "Wy", "Za"]
NAME_MIDDLES = ["", "r", "l", "n", "v", "th", "d", "s", "b", "m"]
NAME_ENDS = ["a", "el", "ric", "wen", "bel", "dor", "na", "lin", "mund", "ette", "ik", "o"]


def _village(rng: random.Random) -> str:
    return rng.choice(ONSETS) + rng.choice(MIDDLES) + rng.choice(MIDDLES) + rng.choice(CODAS)


def _traveller(rng: random.Random) -> str:
    return rng.choice(NAME_STARTS) + rng.choice(NAME_MIDDLES) + rng.choice(NAME_MIDDLES) + rng.choice(NAME_ENDS)


@dataclass(frozen=True)
class Character:
    name: str
    kind: str
    trait: str


def _character(rng: random.Random) -> Character:
    return Character(rng.choice(NAMES), rng.choice(KINDS), rng.choice(TRAITS))


def _article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def _plan(rng: random.Random) -> dict:
    """The content of one story, independent of how it is told."""
    hero = _character(rng)
    friend = _character(rng)
    while friend.name == hero.name:
        friend = _character(rng)
    place, other = rng.sample(range(len(PLACES)), 2)
    return {
        "hero": hero,
        "friend": friend,
        "place": place,
        "other": other,
        "object": rng.choice(OBJECTS),
        "weather": rng.choice(WEATHER),
        "problem": rng.choice(PROBLEMS),
        "feeling": rng.choice(FEELINGS),
        "moral": rng.randrange(len(MORALS)),
        "days": rng.randint(2, 9),
        "unit": rng.choice(["hours", "days"]),
        "village": _village(rng),
        "traveller": _traveller(rng),
    }


def _tell_plain(p: dict, rng: random.Random) -> str:
    hero, friend = p["hero"], p["friend"]
    place, other = PLACES[p["place"]][0], PLACES[p["other"]][0]
    obj, (verb, _) = p["object"], p["problem"]
    opening = rng.choice([
        f"Once there was {_article(hero.trait)} {hero.trait} {hero.kind} named {hero.name}, "
        f"in the village of {p['village']}.",
        f"{hero.name} was {_article(hero.trait)} {hero.trait} {hero.kind} who lived in {p['village']}.",
        f"Every morning {hero.name} the {hero.kind} walked from {p['village']} to {place}.",
    ])
    sentences = [
        opening,
        f"One day {p['weather']}, and {hero.name} {verb} {obj} at {place}.",
        rng.choice([f"{hero.name} felt {p['feeling']} and sat down.", f"{hero.name} did not know what to do."]),
        f"Then {friend.name} the {friend.kind} came by and said, \"Let us look at {other}.\"",
        f"On the way they met a traveller called {p['traveller']}, who pointed the way.",
        rng.choice([
            f"They walked for {p['days']} {p['unit']} and talked the whole way.",
            f"It took them {p['days']} {p['unit']}, but they did not give up.",
        ]),
        f"At {other} they found {obj} under a stone.",
        f"{hero.name} smiled and thanked {friend.name}.",
        MORALS[p["moral"]][0],
    ]
    return " ".join(sentences)


def _tell_storybook(p: dict, rng: random.Random) -> str:
    hero, friend = p["hero"], p["friend"]
    place, other = PLACES[p["place"]][1], PLACES[p["other"]][1]
    obj, (_, perfect) = p["object"], p["problem"]
    opening = rng.choice([
        f"In a time long past there dwelt in {p['village']} {_article(hero.trait)} {hero.trait} "
        f"{hero.kind}, and {hero.name} was the name by which all knew them.",
        f"In the village of {p['village']} there lived, as the tale is told, {_article(hero.trait)} "
        f"{hero.trait} {hero.kind} called {hero.name}.",
    ])
    sentences = [
        opening,
        f"It came to pass upon a certain day, when {p['weather']}, that {hero.name} {perfect} "
        f"{obj} beside {place}.",
        rng.choice([
            f"Then was {hero.name} sorely {p['feeling']}, and sat a long while in silence.",
            f"And {hero.name} knew not which way to turn.",
        ]),
        f"Yet presently there came {friend.name} the {friend.kind}, who spoke thus: "
        f"\"Come, let us seek it at {other}.\"",
        f"Upon the road they met a wayfarer who gave the name {p['traveller']}, and who showed them the way.",
        f"For {p['days']} {p['unit']} did the two companions journey, "
        "and never once did their courage fail.",
        f"And lo, at {other} they beheld {obj}, lying beneath a stone.",
        f"Whereupon {hero.name} gave thanks to {friend.name} with a glad heart.",
        MORALS[p["moral"]][1],
    ]
    return " ".join(sentences)


def plan(index: int, seed: int = 0) -> dict:
    """The content of story ``index`` — characters, places, object, events — before any wording
    (module 9 builds questions with checkable answers from it)."""
    return _plan(random.Random(f"content:{seed}:{index}"))


def story(index: int, seed: int = 0, register: str = "plain") -> str:
    """Story number ``index``: the same content in both registers, worded per register."""
    if register not in REGISTERS:
        raise ValueError(f"register must be one of {REGISTERS}, got {register!r}")
    wording = random.Random(f"wording:{seed}:{index}:{register}")
    return (_tell_plain if register == "plain" else _tell_storybook)(plan(index, seed), wording)


def sentences(index: int, seed: int = 0, register: str = "plain") -> list[str]:
    """Story ``index`` split into its nine sentences; sentence ``k`` tells the same beat in both
    registers (opening, event, feeling, friend, traveller, journey, finding, thanks, moral)."""
    return re.split(r'(?<=[.!?]) (?=[A-Z])|(?<=[.!?]") (?=[A-Z])', story(index, seed, register))


def stories(seed: int = 0, register: str = "plain", start: int = 0) -> Iterator[str]:
    """An endless stream of stories ``start, start + 1, ...``."""
    index = start
    while True:
        yield story(index, seed, register)
        index += 1


def corpus(n_chars: int = 2_000_000, seed: int = 0, register: str = "plain") -> str:
    """At least ``n_chars`` characters of stories, one per line, reproducible from ``seed``."""
    parts, size = [], 0
    for text in stories(seed, register):
        parts.append(text)
        size += len(text) + 1
        if size >= n_chars:
            break
    return "\n".join(parts) + "\n"


# --- real corpora, when there is a network ----------------------------------------------------


def default_cache_dir() -> Path:
    return Path(os.environ.get("POSTTRAINLLM_CACHE", Path.home() / ".cache" / "posttrainllm"))


class CacheNotWritable(OSError):
    """The model cache cannot keep a model: said before minutes of training, not after."""


def model_cache(cache_dir: Path | None = None) -> Path:
    """The folder trained models are kept in (``cache_dir``, else ``POSTTRAINLLM_CACHE``, else
    ``~/.cache/posttrainllm``), made if missing and checked writable: called before a model trains
    (reading cached models needs no write access, so a shared read-only cache works)."""
    cache = Path(cache_dir or default_cache_dir())
    try:
        cache.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=cache):
            pass
    except OSError as err:
        raise CacheNotWritable(
            f"the model cache {cache} cannot be written ({err.strerror or err}), so a model trained now "
            "would be lost: set POSTTRAINLLM_CACHE to a folder you can write"
        ) from None
    return cache


@contextlib.contextmanager
def training_into(cache: Path, target: Path) -> Iterator[None]:
    """Held while a model is trained into ``target`` in ``cache`` (checked writable first): a second
    process that wants the same model (two notebooks, ``posttrainllm models --jobs``) waits for the
    first and then reads what it saved, instead of training it again."""
    model_cache(cache)
    with atomic.locked(target):
        yield


def load_text(url: str, cache_dir: Path | None = None, timeout: float = 30.0) -> str:
    """The text at ``url``, downloaded once into ``cache_dir`` and read from there afterwards.

    The download goes to a temporary file that is renamed into place, so an interrupted
    download never leaves a half file that later looks cached.
    """
    cache_dir = Path(cache_dir or default_cache_dir())
    target = cache_dir / url.rstrip("/").rsplit("/", 1)[-1]
    if not target.is_file():
        cache_dir.mkdir(parents=True, exist_ok=True)
        try:
            with urllib.request.urlopen(url, timeout=timeout) as response:
                payload = response.read()
        except OSError as err:
            raise ConnectionError(
                f"could not download {url} ({err}). Without a network, use the built-in corpus: "
                "posttrainllm.data.corpus()"
            ) from err
        atomic.write_bytes(target, payload)
    return target.read_text(encoding="utf-8")


# --- splits and batches -----------------------------------------------------------------------


def train_val_split(data, val_fraction: float = 0.1):
    """The first ``1 - val_fraction`` of a sequence for training, the rest for validation.

    A contiguous split (not a shuffle) keeps validation text unseen as a whole.
    """
    if not 0 < val_fraction < 1:
        raise ValueError(f"val_fraction must be between 0 and 1, got {val_fraction}")
    cut = int(len(data) * (1 - val_fraction))
    return data[:cut], data[cut:]


def get_batch(data, batch_size: int, block_size: int, device: str = "cpu", generator=None):
    """Random windows of token ids: inputs ``x`` (batch, block) and targets ``y``, ``x`` shifted by one.

    ``data`` is a 1-D sequence of ids (list, numpy array or tensor); ``device`` must exist
    ("cpu", "cuda", "mps" or "auto"); ``generator`` is a seeded ``torch.Generator``.
    """
    import torch

    from posttrainllm.device import resolve_device

    data = torch.as_tensor(data, dtype=torch.long)
    if data.ndim != 1 or len(data) <= block_size:
        raise ValueError(f"need a 1-D sequence longer than block_size={block_size}, got shape {tuple(data.shape)}")
    starts = torch.randint(len(data) - block_size, (batch_size,), generator=generator)
    x = torch.stack([data[s : s + block_size] for s in starts.tolist()])
    y = torch.stack([data[s + 1 : s + 1 + block_size] for s in starts.tolist()])
    device = resolve_device(device)
    return x.to(device), y.to(device)
