"""Group failure reasons into causes, so the report ranks what to build next by tests it would fix."""

from __future__ import annotations

import re

# (pattern on the one-line reason, cause template using the pattern's groups)
_RULES = [
    (r"RlhfkitLacks: rlhfkit has no (\S+)", "rlhfkit lacks {0}"),
    (r"HarnessUnmapped: (.*)", "harness: {0}"),
    (r"(\w+)\.__init__\(\) got an unexpected keyword argument '(\w+)'", "{0} has no argument/field '{1}'"),
    (r"got an unexpected keyword argument '(\w+)'", "unknown keyword argument '{0}'"),
    (r"'(\w+)' object has no attribute '(\w+)'", "{0} has no attribute '{1}'"),
    (r"Timeout", "timeout"),
    (r"^(\w+(?:Error|Exception)): (.{0,80})", "{0}: {1}"),
]


def cause_of(reason: str) -> str:
    """A short cause for a one-line failure reason; the same cause for failures that share a fix."""
    for pattern, template in _RULES:
        match = re.search(pattern, reason)
        if match:
            return template.format(*match.groups())
    return re.sub(r"\d+(\.\d+)?", "N", reason)[:100]
