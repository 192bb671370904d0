"""memtrace_trainer: models, the model zoo, features and the symbolic meta-device tracer."""

__version__ = "0.1.0"


# Set by the tracer while it runs a script (symtrace/script.py); a no-op otherwise.
_MARK = None


def mark(text: str) -> None:
    """Mark a point in a traced script. `mark("iter")` ends the current training iteration (for
    loops without an `optimizer.step()`, or to count iterations your way). Outside a trace it
    does nothing, so a script can keep the call on a real GPU."""
    if _MARK is not None:
        _MARK(text)
