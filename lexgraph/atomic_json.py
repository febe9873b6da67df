"""The one atomic JSON write of the index's small records and caches."""
from __future__ import annotations

import json
import os
import uuid
from pathlib import Path


def write_json(path: Path, value, **layout) -> None:
    """Write `value` (layout: json.dumps options) so that a reader sees the old file or the new one, never
    half of one. The scratch file's name is the writer's own (process and a random part), so concurrent
    writers, in threads or processes, never share one: the last to replace wins."""
    path.parent.mkdir(parents=True, exist_ok=True)
    scratch = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        scratch.write_text(json.dumps(value, **layout), encoding="utf-8")
        os.replace(scratch, path)
    except BaseException:
        scratch.unlink(missing_ok=True)
        raise
