"""A GPU's interconnect as NVML reports it (active NVLinks and their version, the PCIe link
it trained to) and what bus bandwidth a collective should reach over it, from the facts in
``compat/links.toml``. Reading takes the NVML module as an argument, so a fake NVML can stand
in where no GPU exists; the expectation is plain arithmetic over records."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Optional

from . import compat

GB = 1e9


@dataclass(frozen=True)
class GpuLinks:
    """One GPU's links. ``pcie_generation``/``pcie_width``: the maximum the GPU and slot
    negotiate (idle GPUs drop to a lower current generation to save power)."""

    nvlink_version: int = 0  # NVML_NVLINK_VERSION_* of the active links; 0 = none active
    nvlinks_active: int = 0
    pcie_generation: int = 0
    pcie_width: int = 0
    pcie_generation_now: int = 0
    pcie_width_now: int = 0
    error: str = ""  # what NVML could not tell

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class LinkExpectation:
    bytes_per_s: Optional[float]  # None: no figure to compare with (reason says why)
    link: str  # "NVLink 4.0 x18", "PCIe gen 4 x16"
    source: str
    reason: str = ""


def read_links(nvml: Any, handle: Any) -> GpuLinks:
    """The links of the GPU behind ``handle`` (an NVML device handle), read through ``nvml``
    (the pynvml module, initialised by the caller)."""
    version, active = 0, 0
    for link in range(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18)):
        try:
            if nvml.nvmlDeviceGetNvLinkState(handle, link) != getattr(nvml, "NVML_FEATURE_ENABLED", 1):
                continue
            active += 1
            version = max(version, int(nvml.nvmlDeviceGetNvLinkVersion(handle, link)))
        except nvml.NVMLError:  # no such link, or NVLink unsupported on this GPU
            break
    try:
        return GpuLinks(version, active, int(nvml.nvmlDeviceGetMaxPcieLinkGeneration(handle)),
                        int(nvml.nvmlDeviceGetMaxPcieLinkWidth(handle)),
                        int(nvml.nvmlDeviceGetCurrPcieLinkGeneration(handle)),
                        int(nvml.nvmlDeviceGetCurrPcieLinkWidth(handle)))
    except nvml.NVMLError as exc:
        return GpuLinks(version, active, error=f"PCIe link not readable through NVML: {exc}")


def read_links_of_torch_device(index: int) -> GpuLinks:
    """The links of torch's CUDA device ``index``, matched to NVML by UUID (CUDA_VISIBLE_DEVICES
    renumbers devices; NVML does not)."""
    try:
        import pynvml
    except ImportError:
        return GpuLinks(error="nvidia-ml-py is not installed")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return GpuLinks(error=f"NVML: {exc}")
    try:
        import torch

        uuid = str(getattr(torch.cuda.get_device_properties(index), "uuid", "") or "")
        try:
            handle = pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}")
        except (pynvml.NVMLError, TypeError):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        return read_links(pynvml, handle)
    except pynvml.NVMLError as exc:
        return GpuLinks(error=f"NVML: {exc}")
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass


def expected_bandwidth(links: GpuLinks) -> LinkExpectation:
    """What one GPU's link gives per direction: the ceiling of a collective's bus bandwidth."""
    facts = compat.load("links")
    if links.nvlinks_active:
        row = facts["nvlink"].get(str(links.nvlink_version))
        if row is None:
            return LinkExpectation(None, f"NVLink version {links.nvlink_version} x{links.nvlinks_active}", "",
                                   f"NVML reports NVLink version {links.nvlink_version}, which compat/links.toml "
                                   "does not list yet")
        return LinkExpectation(row["gb_per_s_per_link"] * links.nvlinks_active * GB,
                               f"{row['name']} x{links.nvlinks_active}", compat.source(facts, row))
    if links.pcie_generation and links.pcie_width:
        row = facts["pcie"].get(str(links.pcie_generation))
        if row is None:
            return LinkExpectation(None, f"PCIe gen {links.pcie_generation} x{links.pcie_width}", "",
                                   f"PCIe generation {links.pcie_generation} is not in compat/links.toml")
        return LinkExpectation(row["gb_per_s_per_lane"] * links.pcie_width * GB,
                               f"PCIe gen {links.pcie_generation} x{links.pcie_width}", compat.source(facts, row))
    return LinkExpectation(None, "unknown", "", links.error or "NVML reported neither NVLinks nor a PCIe link")


def slowest_link(per_rank: dict[int, GpuLinks]) -> tuple[Optional[int], LinkExpectation]:
    """The rank whose link gives least: a ring collective runs at its slowest hop."""
    expectations = {rank: expected_bandwidth(links) for rank, links in per_rank.items()}
    known = {r: e for r, e in expectations.items() if e.bytes_per_s is not None}
    if not known:
        first = next(iter(expectations.items()), (None, LinkExpectation(None, "unknown", "", "no GPU link figures")))
        return first
    rank = min(known, key=lambda r: known[r].bytes_per_s or 0.0)  # known: all set
    return rank, known[rank]
