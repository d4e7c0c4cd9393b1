"""parlab.wire reads the NVLink counters of the GPU the rank really has, not NVML's GPU of the same index.

NVML numbers every GPU of the machine and ignores CUDA_VISIBLE_DEVICES.  A
server given GPUs 2,3 sees them as cuda:0 and cuda:1; NVML's index 0 is
another user's GPU.  Here a fake pynvml holds four GPUs with their own
counters and a fake torch.cuda maps cuda:0 to physical GPU 2 by UUID, as
the driver does; the NCCL wire count must be GPU 2's traffic only.
"""
import sys
from types import SimpleNamespace

import pytest

from parlab import trace

pytestmark = pytest.mark.unit
UUIDS = [f"GPU-0000000{i}-1111-2222-3333-444444444444" for i in range(4)]


class FakeNvml:
    """Four GPUs with two NVLinks each; ``sent_kib[i]`` is what physical GPU i sent so far."""

    def __init__(self):
        self.sent_kib = [0, 0, 0, 0]
        self.nvmlInit = lambda: None
        self.nvmlDeviceGetHandleByIndex = lambda index: index
        self.nvmlDeviceGetHandleByUUID = lambda uuid: UUIDS.index(uuid)

    def nvmlDeviceGetFieldValues(self, handle, fields):
        (_, link), = fields
        if link >= 2:
            return [SimpleNamespace(nvmlReturn=1, value=None)]  # no such link
        return [SimpleNamespace(nvmlReturn=0, value=SimpleNamespace(ullVal=self.sent_kib[handle] / 2))]


@pytest.fixture
def gpus_2_and_3(monkeypatch):
    import torch

    nvml = FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    # torch reports the UUID without NVML's "GPU-" prefix; cuda:i is physical GPU 2+i
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda i: SimpleNamespace(uuid=UUIDS[2 + i][len("GPU-"):]))
    return nvml


def test_nccl_wire_count_is_the_visible_gpus_own_traffic(gpus_2_and_3):
    with trace.measure_wire("nccl") as wire:
        gpus_2_and_3.sent_kib[2] += 300   # this rank's GPU (cuda:0 = physical 2)
        gpus_2_and_3.sent_kib[0] += 5000  # another student's job on physical GPU 0
    assert not wire.reason and wire.source == "nvml"
    assert wire.sent == 300 * 1024


def test_without_cuda_or_without_nvml_the_reason_says_so(gpus_2_and_3, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with trace.measure_wire("nccl") as wire:
        pass
    assert wire.sent is None and "no CUDA device" in wire.reason
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    with trace.measure_wire("nccl") as wire:
        pass
    assert wire.sent is None and "pip install nvidia-ml-py" in wire.reason


def test_the_gpu_environment_installs_nvidia_ml_py():
    import os
    import re

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(root, "environment.yml")) as f:
        listed = re.findall(r"^\s*-\s*([A-Za-z0-9_.\[\]-]+)", f.read(), flags=re.M)
    assert "nvidia-ml-py" in listed, listed
