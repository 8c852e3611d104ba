"""Per-phase RSS trace of one benchmark workload (issue 16: where does the loop memory go?).

    python rss_trace.py WORKLOAD_SCRIPT --phases Class.method,... [--output FILE.json] -- WORKLOAD ARGS...

Runs `workloads/WORKLOAD_SCRIPT` in this process after wrapping each named method (any class of that name
found in the loaded modules, looked up when the workload has imported it). On entering and leaving a phase
it reads the resident set size, and the peak inside the phase comes from the kernel's own high-water mark
(VmHWM), reset at each phase boundary through /proc/self/clear_refs, so short transients are not missed the
way periodic sampling would miss them. Nested phases are handled: an outer phase's peak includes its inner
ones. Prints one `RSS_TRACE {json}` line: per phase the number of calls, RSS before / after the first call and
the largest peak over all calls, in MiB, plus the import-only RSS.
"""

from __future__ import annotations

import ctypes
import functools
import json
import os
import runpy
import sys
import time
from pathlib import Path

WORKLOADS = Path(__file__).resolve().parent / "workloads"
# RSS_TRACE_TRIM=1: call glibc's malloc_trim after every phase (shows how much of what a phase leaves behind
# is freed heap memory the allocator kept, rather than live data)
TRIM = None
if os.environ.get("RSS_TRACE_TRIM") == "1":
    TRIM = ctypes.CDLL("libc.so.6").malloc_trim


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def _reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS


class Tracer:
    def __init__(self) -> None:
        self.stack: list[dict] = []
        self.phases: dict[str, dict] = {}

    def _fold_peak(self) -> None:
        """Credit the high-water mark since the last reset to every open phase."""
        hwm = _status_kb("VmHWM")
        for frame in self.stack:
            frame["peak"] = max(frame["peak"], hwm)

    def enter(self, name: str) -> None:
        self._fold_peak()
        rss = _status_kb("VmRSS")
        self.stack.append({"name": name, "before": rss, "peak": rss})
        _reset_peak()

    def leave(self) -> None:
        self._fold_peak()
        frame = self.stack.pop()
        if TRIM is not None:
            TRIM(0)
        rss = _status_kb("VmRSS")
        entry = self.phases.setdefault(frame["name"], {"calls": 0, "peak_mb": 0.0})
        if (
            entry["calls"] == 0
        ):  # after the first call: how much of the RSS is anonymous memory, how much files
            entry.update(
                before_mb=frame["before"] / 1024,
                after_mb=rss / 1024,
                after_anon_mb=_status_kb("RssAnon") / 1024,
                after_file_mb=_status_kb("RssFile") / 1024,
            )
        entry["calls"] += 1
        entry["peak_mb"] = max(entry["peak_mb"], frame["peak"] / 1024)
        entry["max_added_mb"] = max(entry.get("max_added_mb", 0.0), (frame["peak"] - frame["before"]) / 1024)
        _reset_peak()

    def wrap(self, owner: type, method: str) -> None:
        original = getattr(owner, method)
        name = f"{owner.__name__}.{method}"

        @functools.wraps(original)
        def traced(*args, **kwargs):
            self.enter(name)
            try:
                return original(*args, **kwargs)
            finally:
                self.leave()

        setattr(owner, method, traced)


def _install(tracer: Tracer, wanted: list[str]):
    """Wrap each Class.method once an import returns a module that has the class (or a subclass)."""
    import builtins

    pending = {tuple(w.split(".", 1)) for w in wanted}
    real_import = builtins.__import__

    def scan(module) -> None:
        for cls_name, method in list(pending):
            owner = getattr(module, cls_name, None) if hasattr(module, cls_name) else None
            for klass in getattr(owner, "__mro__", ()):
                if method in vars(klass):  # wrap where it is defined, so every subclass sees it
                    tracer.wrap(klass, method)
                    pending.discard((cls_name, method))
                    break

    def hooked(*args, **kwargs):
        module = real_import(*args, **kwargs)
        if pending and module is not None:
            scan(module)
        return module

    builtins.__import__ = hooked
    return scan


def _options(before: list[str]) -> dict[str, str]:
    """`--phases A.b,C.d` and `--output FILE` (both optional) from the arguments before `--`."""
    if len(before) % 2 or any(key not in ("--phases", "--output") for key in before[::2]):
        raise SystemExit(f"expected --phases Class.method,... and/or --output FILE before --, got {before}")
    return dict(zip(before[::2], before[1::2]))


def main() -> None:
    script, rest = sys.argv[1], sys.argv[2:]
    split = rest.index("--")
    options = _options(rest[:split])
    phases = [p for p in options.get("--phases", "").split(",") if p]
    command = "python benchmarks/rss_trace.py " + " ".join(sys.argv[1:])
    tracer = Tracer()
    scan = _install(tracer, phases)
    sys.path.insert(0, str(WORKLOADS))
    sys.argv = [str(WORKLOADS / script), *rest[split + 1 :]]
    import torch.optim

    scan(torch.optim)  # optimizers are reached as attributes, never imported by name

    runpy.run_path(str(WORKLOADS / script), run_name="__main__")
    print("RSS_TRACE " + json.dumps({"script": script, "phases": tracer.phases}), flush=True)
    if "--output" in options:  # a result file that names its commit and command
        from _common import git_commit  # the workloads folder is on sys.path by now

        record = {
            "command": command,
            "commit": git_commit(__file__),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "script": script,
            "phases": tracer.phases,
        }
        Path(options["--output"]).write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
