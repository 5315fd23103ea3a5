"""Every paper the book links by arXiv id or DOI is on its references page."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CITATION = re.compile(r"arxiv\.org/(?:abs|pdf)/(\d{4}\.\d{4,5})|doi\.org/(10\.[^\s)>\"'\]]+)")


def cited(text: str) -> set[str]:
    return {arxiv or doi.rstrip(".,") for arxiv, doi in CITATION.findall(text)}


def test_every_cited_paper_is_on_the_references_page():
    sources = [*ROOT.glob("notebooks/*.ipynb"), *ROOT.glob("book/*.md"), *ROOT.glob("posttrainllm/*.py")]
    references = cited((ROOT / "book" / "references.md").read_text())
    missing = {f"{ident} ({path.relative_to(ROOT)})" for path in sources if path.name != "references.md"
               for ident in cited(path.read_text()) - references}
    assert not missing, f"cited but not on book/references.md: {sorted(missing)}"


def test_the_pattern_finds_arxiv_and_doi_links():
    text = "see <https://arxiv.org/abs/2202.07646> and https://doi.org/10.1145/3133956.3134077."
    assert cited(text) == {"2202.07646", "10.1145/3133956.3134077"}
