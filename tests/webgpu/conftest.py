"""The WGSL kernels on a real Vulkan driver, through wgpu-py.

A process picks its Vulkan driver once, when wgpu starts, so ``make test`` runs this directory
twice: ``POSTTRAINLLM_VK_DRIVER=lavapipe`` (Mesa) and ``=swiftshader`` (Chromium's, the one the
browser tests use). The default is lavapipe.
"""

import os

import pytest

from posttrainllm import webgpu
from tests.conftest import require

DRIVER = os.environ.get("POSTTRAINLLM_VK_DRIVER", "lavapipe")


@pytest.fixture(scope="session")
def gpu():
    require(os.path.isfile(webgpu.DRIVERS[DRIVER]), f"the {DRIVER} Vulkan driver ({webgpu.DRIVERS[DRIVER]})")
    pytest.importorskip("wgpu")
    webgpu.use_driver(DRIVER)
    device = webgpu.GPU()
    assert device.info["adapter_type"] == "CPU", f"expected the {DRIVER} CPU driver, got {device.name}"
    return device
