"""The zygote of `serve`'s workers, imported once by the forkserver the server starts (its
preload) and never by the server itself: torch and the model zoo are imported here, one estimate
warms the tracer, and every worker is forked from this process, warm and single-threaded."""

from __future__ import annotations

import atexit
import gc
import importlib
import sys

from memtrace_trainer import serve_worker

# The zoo's libraries, so that no request pays their import; a missing optional one is said once.
for _name in ("torch", "torchvision", "timm", "transformers", "peft",
              "memtrace_trainer.estimate", "memtrace_trainer.models.zoo",
              "memtrace_trainer.models.hf", "memtrace_trainer.symtrace.tracer"):  # fmt: skip
    try:
        importlib.import_module(_name)
    except ImportError as _e:
        print(f"serve: warning: cannot import {_name} ({_e}); requests that need it will "
              "import it themselves", file=sys.stderr)  # fmt: skip

try:
    WARM_ERROR = serve_worker.warm_up()
except Exception as _e:  # reported by the server, which then refuses to start
    WARM_ERROR = f"the warm-up estimate raised {type(_e).__name__}: {_e}"

# Workers are forks: with every object made so far outside the collector's reach, a collection in
# a worker does not write to (and so copy) the pages it shares with the zygote.
gc.collect()
gc.freeze()
# Objects still frozen when the zygote exits are never freed, and nanobind (triton's bindings)
# reports each as a leak at the interpreter's end: hand them back to the collector first.
atexit.register(gc.unfreeze)
