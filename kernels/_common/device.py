"""What the ops' launch plans need to know of the device, in one place: the interpreter, the GPU's
compute capability and SM count, whether this Triton has Gluon's Hopper language.

``DeviceInfo`` is a plain record so that a plan can be made (and tested) for a device that is not
there: ``DeviceInfo(sm_major=9, sms=132, gluon=True)`` on a CPU describes an H200.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch


def interpreting() -> bool:
    """True under TRITON_INTERPRET=1. Its numpy ``tl.dot`` misreads bf16 operands as integers
    (triton 3.9), so kernels get an ``UPCAST`` flag that casts dot operands to fp32 there."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def sm_major(device: torch.device) -> int:
    """The GPU's compute-capability major (9: Hopper), 0 under the interpreter or off CUDA."""
    return 0 if interpreting() or device.type != "cuda" else torch.cuda.get_device_capability(device)[0]


def sm_count(device: torch.device) -> int:
    """Multiprocessors of the GPU; 2 under the interpreter or off CUDA (a persistent grid of a few programs)."""
    if interpreting() or device.type != "cuda":
        return 2
    return torch.cuda.get_device_properties(device).multi_processor_count


def persistent_programs(device: torch.device, per_sm: int, items: int) -> int:
    """Grid of a persistent launch: ``per_sm`` programs per SM, at most one per item."""
    return min(items, per_sm * sm_count(device))


def gluon_hopper_available() -> bool:
    """Whether this Triton has Gluon's Hopper language (wgmma, TMA, mbarriers, warp_specialize)."""
    try:
        from triton.experimental.gluon.language.nvidia import hopper
    except ImportError:
        return False
    return hasattr(hopper, "warpgroup_mma")


@dataclass(frozen=True)
class DeviceInfo:
    """sm_major: compute-capability major (0: CPU or the interpreter); sms: multiprocessors;
    gluon: Gluon's Hopper language is importable; interpret: kernels run in the Triton interpreter."""
    sm_major: int = 0
    sms: int = 2
    gluon: bool = False
    interpret: bool = False


def device_info(device: torch.device) -> DeviceInfo:
    """The ``DeviceInfo`` of ``device`` as this process sees it."""
    major = sm_major(device)
    return DeviceInfo(sm_major=major, sms=sm_count(device), gluon=major == 9 and gluon_hopper_available(),
                      interpret=interpreting())
