"""memtrace_trainer: models, the model zoo, features and the symbolic meta-device tracer."""

__version__ = "0.1.0"
