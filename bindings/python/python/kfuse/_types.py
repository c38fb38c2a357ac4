"""What crosses between kfuse's programs and torch: dtype names, declarations and outputs."""

import collections

import torch

TORCH_DTYPES = {
    "f32": torch.float32,
    "f16": torch.float16,
    "bf16": torch.bfloat16,
    "i32": torch.int32,
    "i64": torch.int64,
    "bool": torch.bool,
}
KFUSE_DTYPES = {v: k for k, v in TORCH_DTYPES.items()}
_KD = KFUSE_DTYPES
FLOAT = ("f32", "f16", "bf16")


class Decl(tuple):
    """A declared tensor: ``name``, ``dtype`` (a torch dtype), ``kfuse_dtype`` (kfuse's name of
    it: ``"f32"``, ``"bf16"``, ...), ``shape`` (symbol names and constants) and, for inputs,
    ``layout`` (``None``, ``("lengths", dim)`` or ``("offsets", dim)``)."""

    __slots__ = ()

    def __new__(cls, name, dtype, shape, layout=None):
        return tuple.__new__(cls, (name, dtype, tuple(shape), layout))

    name = property(lambda self: self[0])
    kfuse_dtype = property(lambda self: self[1])
    dtype = property(lambda self: TORCH_DTYPES[self[1]])
    shape = property(lambda self: self[2])
    layout = property(lambda self: self[3])

    def __repr__(self):
        dims = ", ".join(str(d) for d in self.shape)
        text = f"{self.name}: {self.kfuse_dtype}[{dims}]"
        if self.layout is not None:
            text += f" as {self.layout[0]}({self.layout[1]})"
        return f"Decl({text})"


class Outputs(tuple):
    """A program's outputs in declaration order: a tuple of tensors (``loss, grad = prog(...)``)
    whose items are also found by name (``out.loss`` or ``out["loss"]``); ``keys()``, ``values()``,
    ``items()`` and ``_asdict()`` give the mapping view. Immutable, like any tuple.

    Each program's outputs are a ``collections.namedtuple`` of its output names with these methods
    added (so reading an output by name costs what a namedtuple field costs, and ``torch.compile``
    traces it as a namedtuple); this class is their common base. An output whose name is not a
    valid namedtuple field (a Python keyword, a leading underscore) or is one of these methods'
    names is reached by ``out["name"]``."""

    __slots__ = ()
    _names = ()

    def __getitem__(self, key):
        if key.__class__ is str:
            try:
                key = self._names.index(key)
            except ValueError:
                raise KeyError(f"no output named {key!r} (outputs: {', '.join(self._names)})") from None
        return tuple.__getitem__(self, key)

    def __getattr__(self, name):
        # Only reached for names that are not outputs (outputs are the namedtuple's fields).
        raise AttributeError(f"no output named {name!r} (outputs: {', '.join(self._names)})")

    def _read_only(self, *args, **kwargs):
        raise TypeError("kfuse outputs are read-only")

    __setattr__ = __delattr__ = __setitem__ = __delitem__ = _read_only

    def keys(self):
        """The output names, in declaration order."""
        return self._names

    def values(self):
        """The output tensors, in declaration order."""
        return tuple(self)

    def items(self):
        """``(name, tensor)`` pairs, in declaration order."""
        return tuple(zip(self._names, self))

    def _asdict(self):
        """The outputs as a new ``dict`` from name to tensor."""
        return dict(zip(self._names, self))

    def __repr__(self):
        return "Outputs(" + ", ".join(f"{k}={v!r}" for k, v in zip(self._names, self)) + ")"


def _outputs_type(names):
    """The outputs class of a program whose outputs are `names` (see :class:`Outputs`): a
    subclass of :class:`Outputs` and of the namedtuple of those names, in that order, so that
    Outputs' methods come first and ``torch.compile`` sees a namedtuple."""
    names = tuple(names)
    hidden = set(dir(Outputs)) - set(dir(tuple))
    fields = [f"_{i}" if n in hidden else n for i, n in enumerate(names)]
    base = collections.namedtuple("Outputs", fields, rename=True, module=__name__)
    return type("Outputs", (Outputs, base), {"__slots__": (), "_names": names, "__module__": __name__})


def _decl_str(d):
    s = f"{d.kfuse_dtype}[{', '.join(str(x) for x in d.shape)}]"
    if d.layout is not None:
        s += f" as {d.layout[0]}({d.layout[1]})"
    return s
