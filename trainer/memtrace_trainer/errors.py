"""The one exception type the CLI turns into a clean message instead of a traceback."""


class UserError(Exception):
    """Bad input from the user (a spec, a file, a flag); the message says what was expected."""
