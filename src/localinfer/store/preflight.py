"""Before a download: is there room on disk (refuse), and in memory (warn)?"""

from __future__ import annotations

import shutil

from localinfer.errors import ResourceError
from localinfer.store.fsutil import human_size
from localinfer.store.manifest import Store
from localinfer.store.types import ProgressSink

DISK_MARGIN = 64 * 1024 * 1024  # keep this much free after a download


def check_disk(store: Store, need: int, what: str) -> None:
    root = store.root
    probe = root
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if need + DISK_MARGIN > free:
        raise ResourceError(
            f"not enough disk space for {what}: need {human_size(need)}, free {human_size(free)} in {root}",
            hint="free some space (e.g. 'localinfer rm' unused models) or point LOCALINFER_HOME elsewhere",
        )


def memory_warning(model_bytes: int, total_memory: int) -> str | None:
    """A warning when a model clearly cannot fit in this machine's memory (weights alone exceed RAM)."""
    if model_bytes > total_memory:
        return (
            f"warning: this model needs at least {human_size(model_bytes)} of memory for its weights; "
            f"this machine has {human_size(total_memory)}. It will probably fail to load or be very slow."
        )
    return None


def memory_check(total: int, progress: ProgressSink) -> None:
    try:
        import psutil

        ram = int(psutil.virtual_memory().total)
    except Exception:  # a missing measurement must not stop a pull
        return
    warning = memory_warning(total, ram)
    if warning:
        progress.note(warning)
