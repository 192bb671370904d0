"""The one exception type the CLI turns into a clean message instead of a traceback."""

import functools
import json
import re
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class UserError(Exception):
    """Bad input from the user (a spec, a file, a flag); the message says what was expected."""


class UserCodeError(UserError):
    """The user's own code (a model, an entry or step function) raised: a one-line summary plus
    the user's frames, never a raw traceback."""

    def __init__(self, what: str, exc: BaseException) -> None:
        self.exc = exc
        lines = [f"{what} {type(exc).__name__}: {exc}".strip()]
        lines += [f"  at {f.filename}:{f.lineno} in {f.name}: {f.line or ''}".rstrip(": ")
                  for f in user_frames(exc)]  # fmt: skip
        super().__init__("\n".join(lines))


def nothing_on_the_gpu(what: str) -> UserError:
    """A job whose traced steps allocated nothing on the GPU (a CPU job, a script that ended
    before its loop): the need would be the profile's context alone, a verdict on a job that
    never reached the GPU. Every command that judges a job refuses it so."""
    return UserError(
        f"{what}: nothing was allocated on the GPU in the traced steps, so there is no memory to "
        'estimate (does the model or its data reach "cuda" or the step\'s `device` argument? '
        "does the script reach its training loop with these arguments?)"
    )


def check_batch_size(batch_size: int | None, *, optional: bool = False) -> None:
    """The one check of a batch size every command makes (`--model`, `--entry`, `--step`,
    `symtrace`, `fake-tensor`, `run`): below 1 is refused naming the flag, before anything is
    built (a batch of 0 divided by zero in the features, one of -3 reached the user's code).
    `optional`: None is "not given" and passes, for the caller to fill or refuse."""
    if optional and batch_size is None:
        return
    if not is_integer(batch_size) or batch_size < 1:
        raise UserError(f"--batch-size {batch_size}: expected a positive integer")


def require_batch_size(
    batch_size: int | None, entry: str | None = None, model: str | None = None
) -> None:
    """A `--model` job, or an `--entry` function that takes `batch_size`, has no batch size of
    its own: one not given is refused by every command alike (an entry left without one trained
    at batch 1). `entry`: a function without the parameter builds its own batch, whose size is
    the job's (`load_entry` reads it, and says when a --batch-size given differs), as a `--step`
    function of the device alone takes none. `model`: the spec, whose Filename's `batch:N`
    (`gpumemnet:`) the message says is not used."""
    if batch_size is None and needs_batch_size(entry):
        if entry is None:
            from memtrace_trainer.models.gpumemnet import ROW_BATCH_UNUSED, filename_batch

            if (own := filename_batch(model)) is not None:
                raise UserError(f"--batch-size is required with --model {model}: the batch:{own} "
                                f"in its Filename is not used: {ROW_BATCH_UNUSED}")  # fmt: skip
            raise UserError("--batch-size is required with --model (a model spec has no batch "
                            "of its own)")  # fmt: skip
        raise UserError(f"--batch-size is required with --entry {entry}: the function takes "
                        "`batch_size`, so the job has no batch until one is given")  # fmt: skip


def needs_batch_size(entry: str | None) -> bool:
    """Whether a job needs a batch size given: a model (`entry` None) always, an entry function
    when it takes `batch_size` (one without builds its own batch, the job's)."""
    if entry is None:
        return True
    from memtrace_trainer.workload import entry_takes  # imports torch: only for an entry

    return entry_takes(entry, "batch_size")


def is_integer(v: object) -> bool:
    """An int that is not a bool (YAML's and JSON's `true` is one), as user input is checked."""
    return isinstance(v, int) and not isinstance(v, bool)


def is_number(v: object) -> bool:
    """A number a comparison can take (not a bool, not a string: `seconds: "abc"` made `>=`
    raise)."""
    return isinstance(v, int | float) and not isinstance(v, bool)


def json_object(
    text: str, where: str, expected: str = "a JSON object", not_json: str = "not JSON"
) -> dict:
    """`text` parsed as a JSON object; otherwise a `UserError` naming `where` (a file and line, a
    flag) and what was expected (`not_json`, then the parser's words, when it is not JSON)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise UserError(f"{where}: {not_json} ({e})") from None
    if not isinstance(data, dict):
        raise UserError(f"{where}: expected {expected}")
    return data


def check_input_file(path: Any, where: str, expected: str) -> None:
    """The one check that a path the user gave is a file to read: not there, a folder, a device
    or FIFO (a read would wait forever) are each a `UserError` naming `where` (a flag and the
    path, or the path) and what was `expected`."""
    import os
    import stat

    try:
        mode = os.stat(path).st_mode
    except OSError as e:  # not there ("No such file or directory"), not searchable
        raise _unreadable(where, e.strerror or str(e), expected) from None
    if stat.S_ISDIR(mode):
        raise _unreadable(where, "a directory", expected)
    if not stat.S_ISREG(mode):
        raise _unreadable(where, "not a regular file", expected)


def _unreadable(where: str, why: str, expected: str) -> UserError:
    return UserError(f"{where}: cannot read it: {why}; expected {expected}")


def read_text(path: Any, where: str, expected: str, newline: str | None = None) -> str:
    """The text of a file the user gave, the one way the trainer reads one (a sweep file, a
    GPUMemNet CSV, a run's JSON, a batch file): UTF-8, whole. A path `check_input_file` refuses,
    one this user cannot read, and bytes that are not UTF-8 are each a `UserError` naming `where`
    and what was `expected` (`"a YAML sweep file"`), never an internal error. `newline`: as
    `open` takes it (`""` for the csv module). A leading byte-order mark (a spreadsheet's
    "CSV UTF-8") is not text: it named the first column `\ufeffFilename`."""
    check_input_file(path, where, expected)
    try:
        with open(path, encoding="utf-8-sig", newline=newline) as f:
            return f.read()
    except UnicodeDecodeError as e:
        raise _unreadable(
            where, f"not UTF-8 text ({e.reason} at byte {e.start})", expected
        ) from None
    except OSError as e:
        raise _unreadable(where, e.strerror or str(e), expected) from None


def constructed(
    make: Callable[..., T], data: dict[str, Any], where: str, error: type[UserError] = UserError
) -> T:
    """`make(**data)`, a config from the fields of a JSON object already checked by name: the
    TypeError Python raises for what the constructor still refuses is an `error` naming `where`
    (a run's config file, a model family's config)."""
    try:
        return make(**data)
    except TypeError as e:
        raise error(f"{where}: {e}") from None


# A warning's frames are asked one by one, and sysconfig computes its paths anew on each call.
@functools.lru_cache(maxsize=1)
def _library_dirs() -> tuple[str, ...]:
    import sysconfig
    from pathlib import Path

    dirs = {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    here = Path(__file__).resolve().parent
    dirs.update((str(here), str(here.parent / "memtrace")))  # memtrace_trainer and memtrace
    return tuple(str(Path(d).resolve()) for d in dirs if d)


def user_frames(exc: BaseException) -> list:
    """The traceback frames of `exc` in the user's files: not the standard library, not installed
    packages (torch, transformers, ...), not memtrace_trainer. Empty when there are none."""
    import traceback

    libs = _library_dirs()
    return [f for f in traceback.extract_tb(exc.__traceback__) if is_user_file(f.filename, libs)]


def is_user_file(filename: str, libs: tuple[str, ...] | None = None) -> bool:
    """Whether `filename` is the user's own code: not the standard library, not an installed
    package (torch, transformers, ...), not memtrace's, not generated (`<string>`)."""
    import os

    if filename.startswith("<"):
        return False
    path = os.path.realpath(filename)
    # Installed packages anywhere on the path (site-packages of another environment too).
    parts = path.split(os.sep)
    if "site-packages" in parts or "dist-packages" in parts:
        return False
    return not any(path.startswith(d + os.sep) for d in (libs or _library_dirs()))


def raised_by_memtrace(exc: BaseException) -> bool:
    """Whether the innermost frame of `exc` is memtrace's own code (a fault of the tool, whose
    traceback is what helps), not the model's or PyTorch's on the model's behalf."""
    import traceback
    from pathlib import Path

    here = Path(__file__).resolve().parent
    # The two packages' own directories, not their parent: installed, that is site-packages,
    # where torch lives too.
    ours = (here, here.parent / "memtrace")
    frames = traceback.extract_tb(exc.__traceback__)

    def own(frame: traceback.FrameSummary) -> bool:
        return any(d in Path(frame.filename).resolve().parents for d in ours)

    # The tracer's torch-function and dispatch modes hand each op on to PyTorch last: what
    # PyTorch's C++ raises there (`Autograd not support dtype: Byte` of a model's input) has no
    # frame of its own, so the mode's hand-on line is innermost. Inside the model's own forward
    # or loss (`in_model`) it is PyTorch refusing the model, unless the op has no meta kernel
    # (the tracer's device lacks it: the tool's limit). Elsewhere (the optimizer's step, the
    # tool's own calls) it stays the tool's.
    if getattr(exc, _IN_MODEL, False) and "'Meta' backend" not in str(exc):
        while frames and own(frames[-1]) and _HANDS_ON.search(frames[-1].line or ""):
            frames.pop()
    return bool(frames) and own(frames[-1])


# The line of a mode that hands an op on to PyTorch (`return func(*args, **kwargs)`).
_HANDS_ON = re.compile(r"\bfunc\(\*args, \*\*(kwargs|\(kwargs or \{\}\))\)")
# Set on an exception raised inside the model's forward or its loss (`in_model`).
_IN_MODEL = "_memtrace_in_model"


def in_model(exc: BaseException) -> BaseException:
    """`exc`, marked as raised inside the model's own forward or loss (`raised_by_memtrace`)."""
    try:
        setattr(exc, _IN_MODEL, True)
    except AttributeError:  # an exception type without attributes: judged by its frames alone
        pass
    return exc


class ModelFailedError(UserError):
    """PyTorch refused the model at `batch_size` (`model_failed`): a search may try the next
    size, where a refusal at one size alone (BatchNorm over one sample) is PyTorch's rule."""

    batch_size: int = 0


class EntryFailedError(UserCodeError, ModelFailedError):
    """A `ModelFailedError` of the user's own model, with their frames: an `--entry`'s model
    in the tracer's loop, or a `--step` function's step() (not its builder)."""


def model_label(spec: str, family: str) -> str:
    """A model as messages name it: `--entry 'MOD:FN'`, the API's `python:` model, `--model
    SPEC`."""
    if family != "entry":
        return f"--model {spec}"
    return spec if spec.startswith("python:") else f"--entry {spec!r}"


def model_failed(spec: str, family: str, batch_size: int, doing: str, exc: Exception) -> UserError:
    """A model that failed in PyTorch while `doing` (training it, a forward pass for its
    features): the user's `--entry` or API model with their frames; a zoo model that PyTorch
    itself refuses at this size (BatchNorm in training over one value per channel, an image
    size a ViT does not take) fails on a GPU as well; where it would not, the fault is the
    tracer's, and the message says how to tell. The caller re-raises memtrace's own faults."""
    if (too_large := size_overflow(exc)) is not None:
        return too_large
    if family == "entry":
        failed: ModelFailedError = EntryFailedError(
            f"{model_label(spec, family)}: the model failed at batch {batch_size}:", exc
        )
    else:
        said = str(exc).strip().splitlines()
        failed = ModelFailedError(
            f"--model {spec}: PyTorch refused {doing} at batch {batch_size}: "
            f"{type(exc).__name__}: {said[0] if said else ''} (the same job fails on a GPU; if it "
            "runs there, this is a memtrace fault: set MEMTRACE_TRACEBACK=1 and report it)"
        )
    failed.batch_size = batch_size
    return failed


class SizeOverflowError(UserError):
    """A size past what PyTorch's element count holds: the request's fault, whose message
    quotes PyTorch rather than the field (serve names the field from the sizes given)."""


def size_overflow(exc: BaseException) -> UserError | None:
    """A size so large that a tensor's element count overflows PyTorch's 64-bit integers (a
    batch of 10^15, a sequence of 10^20 tokens): the request's fault, said as such rather than
    as an internal error. `None` for any other exception."""
    if not isinstance(exc, RuntimeError | TypeError | OverflowError):
        return None
    said = str(exc)
    if "overflow" not in said.lower():
        return None
    first = said.strip().splitlines()[0] if said.strip() else type(exc).__name__
    return SizeOverflowError(
        "a tensor's size overflows PyTorch's 64-bit element count, so no device could hold it "
        f"(is --batch-size, --seq-len or --input-shape what you meant?): {first}"
    )
