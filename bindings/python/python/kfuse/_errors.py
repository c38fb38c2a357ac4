"""kfuse's exceptions. Every error kfuse raises is a :class:`Error`."""


class Error(Exception):
    """A kfuse program that cannot be built, derived, compiled or run."""


class ParseError(Error, ValueError):
    """A ``.kf`` program that does not parse or type-check.

    ``str(e)`` is the report ``kfuse check`` prints (the line and a caret under the offending
    text); ``file``, ``line`` and ``column`` (1-based) say where.
    """

    def __init__(self, report, file=None, line=None, column=None):
        super().__init__(report)
        self.file = file
        self.line = line
        self.column = column


class InputError(Error, ValueError):
    """Inputs that do not fit a program: a wrong name, dtype, shape or device, bad
    lengths/offsets (the message names the input), or values whose ``i32`` sum does not fit in
    ``i32`` (the message says so; sum floats instead)."""


class DeviceError(Error):
    """No usable CUDA driver, GPU or NVRTC library; the message says what to install."""


class ConfigError(Error):
    """An environment variable of kfuse's with a value it cannot use (``KFUSE_NO_CACHE=maybe``,
    ``KFUSE_CACHE_MAX_BYTES=lots``, ...); the message names the variable and the values it
    accepts. Raised by the first call that needs the kernel cache (``kfuse.load``,
    ``kfuse.compile``, ``kfuse.cache_info()``), on CPU too."""
