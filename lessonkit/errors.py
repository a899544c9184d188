"""One exception type for bad input: the CLI prints it as one line and exits with code 2."""


class LessonkitError(ValueError):
    """Bad input (missing or corrupt file, wrong shape, unknown name, impossible budget).

    The message names the file or value at fault; nothing deeper is shown to the user.
    """
