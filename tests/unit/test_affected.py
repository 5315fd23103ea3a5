"""`make check` runs what a change can affect: posttrainllm.tools.affected, on this clone's own
notebooks and tests, and on a scratch git repository for what counts as changed."""

import subprocess

import pytest

from posttrainllm.tools.affected import EVERYTHING, _code, _sources, changed_files, closure, selected
from tests.conftest import ROOT

NOTEBOOKS = sorted(ROOT.glob("notebooks/[0-9][0-9]-*.ipynb"))
TESTS = sorted(ROOT.glob("tests/unit/test_*.py"))


def picked(paths, changed):
    return [p.stem for p in selected(ROOT, paths, set(changed))]


def test_a_module_selects_the_notebooks_and_tests_that_import_it_directly_or_through_another():
    assert picked(NOTEBOOKS, ["posttrainllm/sae.py"]) == ["10-evals-and-interpretability"]
    tests = picked(TESTS, ["posttrainllm/sae.py"])
    assert "test_interpretability" in tests and "test_linear" not in tests
    # model.py imports attention.py: every notebook that builds a GPT depends on attention
    assert "07-attention" in picked(NOTEBOOKS, ["posttrainllm/attention.py"])
    assert "01-from-a-line" not in picked(NOTEBOOKS, ["posttrainllm/attention.py"])


def test_a_gate_ties_a_notebook_to_the_module_it_checks_not_to_every_gate_s_module():
    # tools.mastery imports each checked module inside its gate: module 1 calls none that uses speculative
    assert "speculative" not in closure(_code(ROOT / "notebooks/01-from-a-line.ipynb"), _sources(ROOT))
    assert picked(NOTEBOOKS, ["posttrainllm/speculative.py"]) == ["10-evals-and-interpretability"]
    code = "from posttrainllm.tools import mastery\nmastery.check_expected_tokens(f)"
    assert "speculative" in closure(code, _sources(ROOT))


def test_a_module_named_in_a_docstring_or_comment_is_not_a_use():
    code = '"""``show_source(posttrainllm.linear.mse)``"""\n# see posttrainllm.sae\nimport posttrainllm.nn\n'
    used = closure(code, _sources(ROOT))
    assert "nn" in used and not {"linear", "sae"} & used
    assert picked(NOTEBOOKS, ["posttrainllm/linear.py"]) == ["01-from-a-line", "02-gradient-descent", "04-backprop"]


def test_a_notebook_selects_itself_and_the_tests_that_read_notebooks():
    assert picked(NOTEBOOKS, ["notebooks/03-tensors.ipynb"]) == ["03-tensors"]
    tests = picked(TESTS, ["notebooks/03-tensors.ipynb"])
    assert "test_notebook_files" in tests and "test_tokenizer" not in tests


def test_an_asset_selects_the_modules_that_read_its_folder():
    assert "03-tensors" in picked(NOTEBOOKS, ["posttrainllm/assets/webgpu/matmul_tiled.wgsl"])
    assert "test_webgpu_sources" in picked(TESTS, ["posttrainllm/assets/webgpu/cells.js"])


@pytest.mark.parametrize("name", sorted(EVERYTHING))
def test_the_set_up_every_test_runs_under_selects_everything(name):
    assert picked(NOTEBOOKS, [name]) == [p.stem for p in NOTEBOOKS]
    assert picked(TESTS, [name]) == [p.stem for p in TESTS]


def test_nothing_changed_selects_nothing():
    assert picked(NOTEBOOKS, []) == [] and picked(TESTS, []) == []


def test_changed_means_since_the_branch_left_base_committed_or_not_and_untracked(tmp_path):
    def git(*args):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path, check=True,
                       capture_output=True)

    git("init", "-q", "-b", "main")
    for name in ("kept.py", "edited.py", "staged.py"):
        (tmp_path / name).write_text("x = 1\n")
    git("add", ".")
    git("commit", "-q", "-m", "base")
    git("checkout", "-q", "-b", "work")
    (tmp_path / "committed.py").write_text("y = 2\n")
    git("add", "committed.py")
    git("commit", "-q", "-m", "on the branch")
    (tmp_path / "edited.py").write_text("x = 2\n")
    (tmp_path / "staged.py").write_text("x = 3\n")
    git("add", "staged.py")
    (tmp_path / "new.py").write_text("z = 3\n")
    assert changed_files(tmp_path, "main") == {"committed.py", "edited.py", "staged.py", "new.py"}
    with pytest.raises(SystemExit, match="no branch or commit named 'trunk'.*--base"):
        changed_files(tmp_path, "trunk")
