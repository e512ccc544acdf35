"""Memory of a process as Linux accounts it: RSS, PSS and USS (for benches that run workers).

RSS counts every resident page a process maps, so N processes mapping one file count it N
times; PSS divides each shared page among the processes that map it (the PSS of all
processes adds up to the memory they use together); USS is the private part (pages no
other process maps). PSS and USS come from ``/proc/PID/smaps_rollup`` (Linux 4.14+); where
that file is not readable, only RSS is reported (from ``/proc/PID/status``, else this
process's peak).
"""

from __future__ import annotations

import sys
from typing import Optional, Union


def smaps_rollup(pid: Union[int, str] = "self") -> Optional[dict]:
    """``{"rss_bytes", "pss_bytes", "uss_bytes"}`` of a process, or None where
    ``/proc/PID/smaps_rollup`` is not readable (not Linux, an old kernel, no permission)."""
    kb: dict = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as fh:
            for line in fh:
                parts = line.split()
                if len(parts) >= 2 and parts[0].endswith(":") and parts[1].isdigit():
                    kb[parts[0][:-1]] = int(parts[1])
    except OSError:
        return None
    if "Pss" not in kb or "Rss" not in kb:
        return None
    return {"rss_bytes": kb["Rss"] * 1024, "pss_bytes": kb["Pss"] * 1024,
            "uss_bytes": (kb.get("Private_Clean", 0) + kb.get("Private_Dirty", 0)) * 1024}


def rss_bytes(pid: Union[int, str] = "self") -> int:
    """Current RSS of a process in bytes; this process's peak RSS where ``/proc`` is missing."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource  # optional: a Unix-only module, needed only where /proc is missing

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def memory(pid: Union[int, str] = "self") -> dict:
    """RSS, PSS and USS in bytes where ``smaps_rollup`` is readable; else RSS alone, with
    ``"note"`` saying why PSS and USS are missing."""
    m = smaps_rollup(pid)
    if m is not None:
        return m
    return {"rss_bytes": rss_bytes(pid), "note": f"/proc/{pid}/smaps_rollup not readable: RSS only"}
