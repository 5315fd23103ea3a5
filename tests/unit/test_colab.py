"""The notebooks' install cell (posttrainllm.tools.colab): present and current in every notebook,
silent where the package is installed, and on a machine without the book, the real thing — it
clones the book and installs the package, and the notebook's imports and study queue then work."""

import json
import subprocess
import sys

import pytest

from posttrainllm.tools import colab, lite
from tests.conftest import ROOT, clean_env, fresh_venv

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
URL = colab.repository_url(ROOT)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_notebook_opens_with_the_current_install_cell(path):
    nb = json.loads(path.read_text(encoding="utf-8"))
    first = next(c for c in nb["cells"] if c["cell_type"] == "code")
    assert "".join(first["source"]) == colab.install_cell(URL), "run `python -m posttrainllm.tools.colab .`"
    assert first["metadata"]["tags"] == colab.TAGS and first["outputs"] == []
    assert not any(colab.TAG in c["metadata"].get("tags", []) for c in lite.edition(nb)["cells"])


def test_the_repository_address_is_read_from_the_config(tmp_path):
    (tmp_path / "_config.yml").write_text("title: x\nrepository:\n  path_to_book: ''\n  url: https://example.org/a/b\n")
    assert colab.repository_url(tmp_path) == "https://example.org/a/b"
    (tmp_path / "_config.yml").write_text("title: x\n")
    with pytest.raises(ValueError, match="no `repository: url:`"):
        colab.repository_url(tmp_path)


def test_the_cell_is_silent_where_the_package_is_installed():
    result = subprocess.run([sys.executable, "-c", colab.install_cell(URL) + "\nprint(os.getcwd())"], cwd=ROOT,
                            capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout == f"{ROOT}\n" and result.stderr == ""


def test_on_a_machine_without_the_book_the_cell_installs_it(tmp_path):
    python = fresh_venv(tmp_path / "venv")
    # offline: git fetches the address from this clone, pip builds with what it has
    env = clean_env(HOME=str(tmp_path), GIT_CONFIG_COUNT="1", GIT_CONFIG_KEY_0=f"url.file://{ROOT}.insteadOf",
                    GIT_CONFIG_VALUE_0=URL, PIP_NO_INDEX="1", PIP_NO_BUILD_ISOLATION="0")
    after = """
import posttrainllm
from posttrainllm.tools import study
print(posttrainllm.__file__)
print(os.getcwd())
print(len(study.load()))
"""
    result = subprocess.run([python, "-c", colab.install_cell(URL) + after], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    package, cwd, topics = result.stdout.split()
    book = tmp_path / "posttrainllm"
    assert package == str(book / "posttrainllm" / "__init__.py") and cwd == str(book / "notebooks")
    assert int(topics) >= 19  # the clone's study queue, found from the notebooks' folder
