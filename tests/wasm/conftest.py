"""The WASM trainer under node, against the PyTorch oracle.

The builds under test are rebuilt from ``posttrainllm/assets/wasm/`` with Emscripten at the start of the session
(CI installs it), so a test can never pass on a stale committed binary; ``test_build`` checks
that the committed ``posttrainllm/assets/wasm/dist`` is byte for byte what the source builds. Without Emscripten on
a laptop, the tests run on the committed builds instead and the rebuild checks skip.
"""

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from posttrainllm import wasm
from posttrainllm.model import oracle_setup
from tests.conftest import IN_CI, require

STEPS = 100  # the drift horizon


def have_emcc() -> bool:
    return shutil.which("emcc") is not None


@pytest.fixture(scope="session")
def rebuilt(tmp_path_factory):
    require(have_emcc(), "Emscripten (apt-get install emscripten)")
    out = tmp_path_factory.mktemp("wasm-dist")
    env = {**os.environ, "PYTHON": sys.executable}  # build.sh runs zig (the Memory64 build) through it
    subprocess.run(["bash", str(wasm.WASM / "build.sh"), str(out)], check=True, capture_output=True, env=env)
    return out


@pytest.fixture(scope="session")
def dist(request):
    """The builds to test: rebuilt from source where Emscripten is (always in CI)."""
    require(shutil.which("node") is not None, "node (apt-get install nodejs)")
    if have_emcc() or IN_CI:
        return request.getfixturevalue("rebuilt")
    return wasm.DIST


@pytest.fixture(scope="session")
def oracle():
    """Module 7's config and training ids, and the oracle's losses over STEPS steps from the
    trainer's own initialisation on the trainer's batches."""
    config, _, ids, _ = oracle_setup()
    model = wasm.oracle_at_init(config)
    return {"config": config, "ids": ids, "losses": np.array(wasm.oracle_losses(model, ids, STEPS, wasm.BATCH))}
