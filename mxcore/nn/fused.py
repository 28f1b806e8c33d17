"""Fused projections: sibling linear layers that read the same input (an attention's q, k and v; an MLP's gate and
up) quantized as one :class:`~mxcore.nn.Linear`, as serving engines store them.

A decode step's launches each cost a fixed time beside their weight's bytes, so one launch over the three weights
is faster than three (docs/torch.md, "Fused projections").  :func:`~mxcore.nn.quantize_` with ``fuse=`` makes, in
the parent module, a :class:`FusedLinear` over the members' concatenated weights (named after them: ``qkv_proj``,
``gate_up_proj``) and puts a :class:`FusedPart` in each member's place, so the parent's forward runs unchanged.

The first part called with an input computes the fused product and leaves it on the input tensor (an attribute
named after the fused layer) for the other parts, which take their columns; the last one clears it, and it goes
with the input in any case.  A part computes the product again for another input, under other grad modes, or for
the same tensor changed in place since (in eager mode; inside torch.compile, or for an inference tensor, which has
no version counter, such a change is not seen: the parts must read their input unchanged, as a model's
projections do).  MX weights are quantized row by row (blocks along ``in_features``), so the fused weight's codes
and scales are the members' own, bit for bit.

A part's output is a view of the fused output's columns (``narrow``): as serving engines' q / k / v, not contiguous
where there are several rows.
"""

from __future__ import annotations

import torch

from ..errors import InputTypeError
from ..torch.ops import tensor_version
from .linear import Linear, MXConfig

__all__ = ["DEFAULT_GROUPS", "FusedLinear", "FusedPart", "fusion_groups", "fused_name"]

#: the sibling layers ``fuse=True`` fuses, by child name (transformers' Llama, Mistral, Qwen2, Gemma, ... names)
DEFAULT_GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


def fusion_groups(fuse) -> tuple:
    """``quantize_``'s ``fuse=`` as a tuple of name groups: False / None: none; True: :data:`DEFAULT_GROUPS`; else
    the groups given (each two or more child names)."""
    if fuse is None or fuse is False:
        return ()
    if fuse is True:
        return DEFAULT_GROUPS
    try:
        groups = tuple(tuple(g) for g in fuse)
    except TypeError:
        groups = None
    if not groups or any(isinstance(g, str) for g in fuse) or any(
            len(g) < 2 or len(set(g)) != len(g) or not all(isinstance(n, str) and n for n in g) for g in groups):
        raise InputTypeError(f"fuse={fuse!r}: give True (the default groups {DEFAULT_GROUPS}), False, or groups of "
                             "two or more distinct child names, such as [('q', 'k', 'v'), ('gate', 'up')]")
    return groups


def fused_name(names) -> str:
    """The fused layer's name: the members' common suffix after their joined prefixes (``qkv_proj``,
    ``gate_up_proj``; ``qkv`` for ``q, k, v``)."""
    suffix = ""
    for cut in range(min(map(len, names)) - 1, 0, -1):
        tail = names[0][-cut:]
        if tail.startswith("_") and all(n.endswith(tail) and len(n) > cut for n in names):
            suffix = tail
            break
    heads = [n[:len(n) - len(suffix)] for n in names]
    return ("".join(heads) if all(len(h) == 1 for h in heads) else "_".join(heads)) + suffix


class FusedLinear(Linear):
    """A :class:`~mxcore.nn.Linear` over the concatenated weights of sibling layers (``parts``, each ``sizes[i]``
    output features); calling it gives their outputs side by side.  Made by :func:`~mxcore.nn.quantize_` with
    ``fuse=``."""

    @classmethod
    def from_parts(cls, layers, names, config: MXConfig) -> FusedLinear:
        w = torch.cat([lin.weight.detach() for lin in layers])
        bias = layers[0].bias
        new = cls(layers[0].in_features, w.shape[0], bias is not None, config, weight=w, device=w.device,
                  dtype=w.dtype)
        if bias is not None:
            with torch.no_grad():
                new.bias.copy_(torch.cat([lin.bias.detach() for lin in layers]))
            new.bias.requires_grad_(bias.requires_grad)  # (a frozen model's biases stay frozen)
        new.parts = tuple(names)
        new.sizes = tuple(lin.out_features for lin in layers)
        new.offsets = tuple(sum(new.sizes[:i]) for i in range(len(new.sizes)))
        new._name_snapshot()
        return new

    def _name_snapshot(self) -> None:
        # the attribute under which a part leaves its siblings this layer's product on the input tensor itself: what
        # torch.compile guards (a tensor's attributes), and gone with the input; one name per layer object
        self.__dict__["_snapshot"] = f"_mxcore_fused_{id(self):x}"

    def extra_repr(self) -> str:
        return super().extra_repr() + ", parts=" + ", ".join(f"{n}[{s}]" for n, s in zip(self.parts, self.sizes))

    def __getstate__(self):
        state = super().__getstate__()
        state.pop("_snapshot", None)  # named after the object: a copy names its own
        return state

    def __setstate__(self, state):
        super().__setstate__(state)
        self._name_snapshot()


class FusedPart(torch.nn.Module):
    """Member ``index`` of a :class:`FusedLinear`, in the member's place: its columns of the fused product of its
    input (computed once for the parts called with the same input in turn).  It holds no weight: the fused layer,
    a sibling in the parent, does."""

    def __init__(self, fused: FusedLinear, index: int):
        super().__init__()
        self.__dict__["_fused"] = fused  # not a submodule: the parent owns it (its state_dict entry is the parent's)
        self.index = index
        self.in_features, self.out_features = fused.in_features, fused.sizes[index]
        self._bit, self._others = 1 << index, ((1 << len(fused.sizes)) - 1) & ~(1 << index)

    @property
    def fused(self) -> FusedLinear:
        return self.__dict__["_fused"]

    def forward(self, x):
        fused = self.__dict__["_fused"]
        name = fused.__dict__["_snapshot"]
        compiling = torch.compiler.is_compiling()  # (a traced tensor's version is no number to compare)
        # (torch.compile guards on grad mode and does not trace inference mode, which it does not need)
        modes = torch.is_grad_enabled() if compiling else (torch.is_grad_enabled(), torch.is_inference_mode_enabled())
        # what a sibling left on this very input: (the fused product, the parts yet to take theirs, the input's
        # version, the grad modes it was computed under), replaced whole, never changed in place
        snap = getattr(x, name, None)
        if (snap is not None and snap[1] & self._bit and snap[3] == modes
                and (compiling or snap[2] == tensor_version(x))):
            rest = snap[1] & ~self._bit
            setattr(x, name, (snap[0], rest, snap[2], modes) if rest else None)  # the last part: nothing kept
            y = snap[0]
        else:
            y = fused(x)
            setattr(x, name, (y, self._others, 0 if compiling else tensor_version(x), modes))
        return y.narrow(-1, fused.offsets[self.index], fused.sizes[self.index])

    def extra_repr(self) -> str:
        f = self.fused
        return (f"in_features={self.in_features}, out_features={self.out_features}, part {self.index} of the fused "
                f"{'+'.join(f.parts)} ({f.config.describe()})")
