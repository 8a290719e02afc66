"""Messages: every line the lab prints about itself goes to stderr, prefixed with the
program's name; an error names the input, the value and what was expected."""

import sys

PROGRAM = "memlab"


class LabError(Exception):
    """A refusal or a failure, for a person: printed as 'memlab: <message>', exit 2."""


def die(message):
    raise LabError(message)


def log(message):
    print(f"{PROGRAM}: {message}", file=sys.stderr, flush=True)


def say(line):
    """A line as is (already prefixed, or a tool's output passed on), on stderr."""
    print(line, file=sys.stderr, flush=True)
