"""The wheel carries a copy of the study queue's topics (``book/study-queue.md``, the page the book
renders and the one source of them), so that a notebook run from a pip install, with no clone
around it, still shows its study cards (``posttrainllm.tools.study.queue_path``)."""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

QUEUE = Path(__file__).resolve().parent / "book" / "study-queue.md"


class BuildPyWithQueue(build_py):
    def run(self) -> None:
        super().run()
        target = Path(self.build_lib) / "posttrainllm" / "assets" / "study-queue.md"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(QUEUE.read_bytes())


setup(cmdclass={"build_py": BuildPyWithQueue})
