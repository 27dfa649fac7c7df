"""What llama.cpp reported allocating for one load (its log: "CPU KV buffer size = 11.25 MiB",
"offloaded 31/31 layers to GPU"), by kind and device: what the estimate is checked against, and
what ``run --json`` and the bench report."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

MiB = 1 << 20
_BUFFER_LINE = re.compile(r"(\S+)\s+(model|KV|compute|output|RS) buffer size\s*=\s*([\d.]+)\s*MiB")
_OFFLOADED = re.compile(r"offloaded (\d+)/(\d+) layers to GPU")
_HOST_PREFIXES = ("CPU",)  # CPU, CPU_Mapped, CPU_REPACK, CUDA_Host is pinned host memory too


def _is_host(device: str) -> bool:
    return device.startswith(_HOST_PREFIXES) or device.endswith("_Host")


@dataclass(frozen=True)
class BufferReport:
    """llama.cpp's own buffer sizes for one load, by kind and device (bytes)."""

    buffers: tuple[tuple[str, str, int], ...]  # (kind: model|KV|compute|output|RS, device, bytes)
    offloaded: int | None  # layers llama.cpp says it offloaded (None: it did not say: no GPU)
    offloadable: int | None

    def total(self, kind: str | None = None, *, host: bool | None = None) -> int:
        return sum(
            b
            for k, dev, b in self.buffers
            if (kind is None or k == kind) and (host is None or _is_host(dev) == host)
        )

    @property
    def model_devices(self) -> tuple[str, ...]:
        return tuple(dev for k, dev, _ in self.buffers if k == "model")

    def by_device(self, kind: str = "model") -> dict[str, int]:
        """Bytes of one kind of buffer per llama.cpp buffer (``CUDA0``, ``RPC0[host:port]``,
        ``CPU_Mapped``): where the weights went, split over devices."""
        out: dict[str, int] = {}
        for k, dev, b in self.buffers:
            if k == kind:
                out[dev] = out.get(dev, 0) + b
        return out

    def to_json(self) -> dict[str, int]:
        return {
            "weights_bytes": self.total("model"),
            "kv_cache_bytes": self.total("KV"),
            "compute_bytes": self.total("compute"),
            "output_bytes": self.total("output"),
            "total_bytes": self.total(),
        }


def parse_buffer_report(lines: Iterable[str]) -> BufferReport:
    """The buffer sizes in llama.cpp's log lines (engine LlamaModel.memory_log)."""
    buffers: list[tuple[str, str, int]] = []
    offloaded = offloadable = None
    for line in lines:
        m = _BUFFER_LINE.search(line)
        if m:
            buffers.append((m.group(2), m.group(1), round(float(m.group(3)) * MiB)))
            continue
        m = _OFFLOADED.search(line)
        if m:
            offloaded, offloadable = int(m.group(1)), int(m.group(2))
    weights_on = [dev for kind, dev, _ in buffers if kind == "model"]
    if offloaded and weights_on and all(map(_is_host, weights_on)):
        # llama.cpp counts the layers it was asked to offload even when no device took them (a GPU
        # build whose driver shows no GPU, an RPC build without servers): nothing left the host.
        offloaded = 0
    return BufferReport(tuple(buffers), offloaded, offloadable)
