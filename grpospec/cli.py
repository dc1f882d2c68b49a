"""What both command lines share: error messages worded with the option's name."""

from __future__ import annotations

import dataclasses


def option_message(message: str, *configs) -> str:
    """A configuration error worded with the command-line option: ``learning_rate must be
    > 0, got -0.1`` becomes ``--learning-rate must be > 0, got -0.1`` when
    ``learning_rate`` is a field of one of the dataclasses ``configs``.

    >>> from grpospec import CountingConfig
    >>> option_message("learning_rate must be > 0, got -0.1", CountingConfig)
    '--learning-rate must be > 0, got -0.1'
    """
    names = {f.name for c in configs for f in dataclasses.fields(c)}
    head, sep, rest = message.partition(" ")
    if head in names:
        return f"--{head.replace('_', '-')}{sep}{rest}"
    return message
