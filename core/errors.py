"""
The project's errors: a ProjectError carries a one-line cause and an optional suggestion, for a problem the
user's input caused (a file, a flag, the data), not a bug. Command-line scripts print both and exit 2
(cli.run_cli) instead of dumping a traceback.
"""
import math


class ProjectError(Exception):
    """A problem caused by the user's input (file, flag, data), not a bug."""

    def __init__(self, message, suggestion=None):
        super().__init__(message)
        self.message = message
        self.suggestion = suggestion

    def __str__(self):
        return self.message


class MetaFileError(ProjectError):
    """A char-level meta.pkl is missing, unreadable, unsafe or malformed."""


class BinaryFileError(ProjectError):
    """A token/label .bin file is missing, truncated, mis-sized or out of range."""


class CheckpointError(ProjectError):
    """A checkpoint is missing, corrupt, unsafe or of the wrong kind."""


class TokenizationMismatchError(ProjectError, ValueError):
    """Two parts of the pipeline disagree on tokenization (method or vocab)."""


class DataError(ProjectError):
    """A text corpus or token stream cannot be used (empty, too short, bad encoding)."""


def check_finite(value, what, step):
    """Raise a clear error on NaN/inf instead of letting a broken model be saved."""
    if not math.isfinite(value):
        raise ProjectError(f"{what} became {value} at step {step}; training stopped without "
                           f"writing a checkpoint for this state",
                           "lower the learning rate, enable gradient clipping, or use float32")
