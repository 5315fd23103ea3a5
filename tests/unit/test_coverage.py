import json
import re

import pytest

from posttrainllm.tools import coverage, study
from tests.conftest import ROOT


def test_every_package_module_is_taught_by_some_notebook_section():
    assert coverage.untaught(ROOT) == []


def test_every_mapped_section_is_a_real_heading_of_its_notebook():
    for item, sections in coverage.coverage_map(ROOT).items():
        for section in sections:
            anchors = ["", *(slug for _, slug in study.headings(ROOT / section.notebook))]
            assert section.anchor in anchors, (item, section)


def test_modules_used_reads_imports_and_attribute_access():
    code = "import posttrainllm.linear\nfrom posttrainllm import (study,\n  mastery as m)\nposttrainllm.source.x"
    assert coverage.modules_used(code) == {"linear", "study", "mastery", "source"}
    two_lines = "from posttrainllm import matmul as mm\nfrom posttrainllm import precision as fp  # fp16\nx = 1"
    assert coverage.modules_used(two_lines) == {"matmul", "precision"}


def test_kernel_files_are_mapped_to_the_section_that_names_them(tmp_path):
    assets = tmp_path / "posttrainllm" / "assets"
    (assets / "webgpu").mkdir(parents=True)
    (assets / "webgpu" / "matmul_tiled.wgsl").write_text("// kernel")
    (assets / "wasm" / "build").mkdir(parents=True)
    (assets / "wasm" / "build" / "out.js").write_text("")  # built output is not source
    (tmp_path / "notebooks").mkdir()
    cells = [
        {"cell_type": "markdown", "source": ["## Tiled matmul on the GPU\n"]},
        {"cell_type": "code", "source": ["run('matmul_tiled.wgsl')"]},
    ]
    (tmp_path / "notebooks" / "03-t.ipynb").write_text(json.dumps({"cells": cells}))
    name = "posttrainllm/assets/webgpu/matmul_tiled.wgsl"
    assert coverage.asset_files(tmp_path) == [name]
    [section] = coverage.coverage_map(tmp_path)[name]
    assert section == coverage.Section("notebooks/03-t.ipynb", "Tiled matmul on the GPU", "tiled-matmul-on-the-gpu")


def test_a_clone_inside_a_folder_named_build_still_has_assets(tmp_path):
    root = tmp_path / "build" / "book"
    (root / "posttrainllm" / "assets" / "webgpu").mkdir(parents=True)
    (root / "posttrainllm" / "assets" / "webgpu" / "k.wgsl").write_text("// kernel")
    assert coverage.asset_files(root) == ["posttrainllm/assets/webgpu/k.wgsl"]


def test_a_folder_that_is_not_a_book_is_named_in_the_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="has no notebooks/ folder"):
        coverage.coverage_map(tmp_path)


def test_markdown_table_lists_untaught_items_plainly(tmp_path):
    (tmp_path / "notebooks").mkdir()
    table = coverage.markdown_table(tmp_path)
    assert "| `posttrainllm.linear` | **not taught yet** |" in table
    assert "`posttrainllm.tools.cli`" in table.split("| --- | --- |")[1].splitlines()[-1]


def test_executable_book_pages_count_as_teaching_but_plain_pages_do_not(tmp_path):
    (tmp_path / "book").mkdir()
    (tmp_path / "notebooks").mkdir()
    code = "```{code-cell} python3\n# a comment, not a heading\nfrom posttrainllm import moe\n```\n"
    (tmp_path / "book" / "ref.md").write_text(f"---\nfile_format: mystnb\n---\n# Ref\n\n## Experts\n\n{code}")
    (tmp_path / "book" / "plain.md").write_text(f"# Plain\n\n## Linear\n\n{code.replace('moe', 'linear')}")
    sections = coverage.coverage_map(tmp_path)
    assert sections["posttrainllm.moe"] == [coverage.Section("book/ref.md", "Experts", "experts")]
    assert sections["posttrainllm.linear"] == []


def test_the_clone_is_found_from_any_working_folder(tmp_path, monkeypatch):
    from posttrainllm.tools.checkout import repo_root

    monkeypatch.delenv("POSTTRAINLLM_ROOT", raising=False)
    monkeypatch.chdir(tmp_path)  # an editable install finds its clone from where the package sits
    assert repo_root() == ROOT


def test_every_registered_gate_is_run_in_its_own_module_and_every_run_gate_is_registered():
    from posttrainllm.tools import mastery

    runs = coverage.gate_map(ROOT)
    assert set(runs) == set(mastery.GATES), f"gates run but not registered: {set(runs) - set(mastery.GATES)}"
    for gate, (module, kind) in mastery.GATES.items():
        assert callable(getattr(mastery, gate)) and kind in (mastery.WRITE, mastery.FIND)
        assert runs[gate], f"{gate} is registered but no notebook runs it"
        home = f"notebooks/{module:02d}-"
        assert all(s.notebook.startswith(home) for s in runs[gate]), f"{gate} runs outside module {module}"


def test_the_mastery_page_lists_every_gate_with_a_link_to_its_section():
    from posttrainllm.tools import mastery

    table = coverage.mastery_table(ROOT)
    for gate in mastery.GATES:
        row = next(line for line in table.splitlines() if f"| `{gate}` |" in line)
        assert "../notebooks/" in row and "not run by any notebook" not in row, row


def test_the_curriculum_names_every_gate():
    from posttrainllm.tools import mastery

    text = (ROOT / "book" / "curriculum.md").read_text(encoding="utf-8")
    modules = dict(re.findall(r"^## Module (\d+):(.*?)(?=^## |\Z)", text, flags=re.M | re.S))
    for gate, (module, kind) in mastery.GATES.items():
        section = modules[str(module)]
        if kind == mastery.WRITE:
            name = mastery.describe(gate).split("`")[1].split("(")[0]
            assert f"`{name}" in section, f"book/curriculum.md's module {module} does not mention {name} ({gate})"
        else:
            assert "to find out" in section, f"book/curriculum.md's module {module} lists no find-out ({gate})"


def test_every_module_has_at_least_three_gates_of_both_kinds():
    from posttrainllm.tools import mastery

    for module in range(1, 11):
        kinds = [kind for m, kind in mastery.GATES.values() if m == module]
        assert len(kinds) >= 3 and set(kinds) == {mastery.WRITE, mastery.FIND}, (module, kinds)
