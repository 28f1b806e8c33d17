"""``mxcore.nn.quantize_``: swap a model's ``torch.nn.Linear`` layers for :class:`~mxcore.nn.Linear` in place, and
optionally fuse sibling projections (:mod:`mxcore.nn.fused`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .fused import FusedLinear, FusedPart, fused_name, fusion_groups
from .linear import Linear, MXConfig

__all__ = ["QuantizeReport", "quantize_"]


@dataclass
class QuantizeReport:
    """What :func:`quantize_` did: the swapped layers' names, the skipped ones with the reason, the fused groups
    (fused layer's name -> its members' names) and the groups left unfused with the reason (their members are
    swapped one by one)."""

    config: MXConfig
    swapped: list = field(default_factory=list)
    skipped: dict = field(default_factory=dict)
    fused: dict = field(default_factory=dict)
    unfused: dict = field(default_factory=dict)

    def __str__(self) -> str:
        head = f"quantize_ ({self.config.describe()}): {len(self.swapped)} layer(s) swapped, {len(self.skipped)} skipped"
        if self.fused or self.unfused:
            head += f", {len(self.fused)} group(s) fused, {len(self.unfused)} not"
        lines = [head]
        lines += [f"  skipped {name}: {why}" for name, why in self.skipped.items()]
        lines += [f"  not fused {name}: {why}" for name, why in self.unfused.items()]
        return "\n".join(lines)


def quantize_(model: torch.nn.Module, config="mxfp8", filter_fn=None, fuse=False) -> QuantizeReport:
    """Swap every ``torch.nn.Linear`` of ``model`` (in place) for an :class:`mxcore.nn.Linear` with ``config``.

    ``filter_fn(module, fqn) -> bool``: swap only the layers it accepts.  Layers whose shapes the config cannot
    quantize are left as they are and listed in the returned :class:`QuantizeReport` (``report.skipped``: name ->
    reason); so are layers ``filter_fn`` declines.  ``model`` itself may be a ``torch.nn.Linear``: it cannot be
    replaced in place, so it is reported as skipped (use :meth:`Linear.from_float`).

    ``fuse``: True fuses the sibling layers of :data:`~mxcore.nn.fused.DEFAULT_GROUPS` (``q_proj, k_proj, v_proj``
    and ``gate_proj, up_proj``, where a module has all of a group as ``torch.nn.Linear`` children); a list of
    name groups fuses those.  Each group becomes one :class:`~mxcore.nn.fused.FusedLinear` child of its parent
    (``qkv_proj``, ``gate_up_proj``) with a :class:`~mxcore.nn.fused.FusedPart` in each member's place, so the
    parent's forward is unchanged.  Fuse only layers that read the same input: a cross-attention (its k and v read
    the encoder's states) is left unfused by its name, and so are the members of a container parent.  Only MX
    inference configs fuse (their weights are quantized row by row, so the fused codes are the members' own); a
    group that cannot fuse is swapped layer by layer and listed in ``report.unfused`` with the reason."""
    cfg = MXConfig.parse(config)
    groups = fusion_groups(fuse)
    report = QuantizeReport(cfg)
    if type(model) is torch.nn.Linear:
        report.skipped[""] = "the model is itself a Linear: use mxcore.nn.Linear.from_float(model, config)"
        return report
    for parent_name, parent in list(model.named_modules()):
        prefix = f"{parent_name}." if parent_name else ""
        for names in groups:
            _fuse(parent, prefix, names, cfg, filter_fn, report)
        for child_name, child in list(parent.named_children()):
            if type(child) is not torch.nn.Linear:
                continue
            fqn = prefix + child_name
            if filter_fn is not None and not filter_fn(child, fqn):
                report.skipped[fqn] = "filter_fn declined it"
                continue
            reason = cfg.unquantizable(child.in_features, child.out_features)
            if reason is not None:
                report.skipped[fqn] = reason
                continue
            setattr(parent, child_name, Linear.from_float(child, cfg))
            report.swapped.append(fqn)
    return report


def _fuse(parent, prefix: str, names, cfg: MXConfig, filter_fn, report: QuantizeReport) -> None:
    """Fuse ``parent``'s children ``names`` if all are ``torch.nn.Linear`` and can fuse (else note why, and leave
    them to the layer-by-layer swap)."""
    layers = [parent._modules.get(n) for n in names]
    if any(type(lin) is not torch.nn.Linear for lin in layers):
        return  # not this pattern here
    name = fused_name(names)
    fqns = [prefix + n for n in names]
    if filter_fn is not None and not all(filter_fn(lin, f) for lin, f in zip(layers, fqns)):
        report.unfused[prefix + name] = "filter_fn declined a member (see skipped)"
        return  # the layer-by-layer swap asks filter_fn again and reports which it declined
    why = _why_not(parent, prefix, layers, name, cfg)
    if why is not None:
        report.unfused[prefix + name] = why
        return
    fused = FusedLinear.from_parts(layers, names, cfg)
    parent.add_module(name, fused)
    for i, n in enumerate(names):
        setattr(parent, n, FusedPart(fused, i))
    report.swapped.extend(fqns)
    report.fused[prefix + name] = tuple(fqns)


#: parents whose q / k / v read two inputs (the decoder's states and the encoder's): not fused by name
_CROSS = ("encoder_attn", "crossattention", "cross_attn", "cross_attention")


def _why_not(parent, prefix: str, layers, name: str, cfg: MXConfig) -> str | None:
    if isinstance(parent, (torch.nn.Sequential, torch.nn.ModuleList, torch.nn.ModuleDict)):
        return "the parent is a container: a fused child would be one more of its members"
    own = prefix.rstrip(".").rsplit(".", 1)[-1].lower()
    if own in _CROSS or "cross" in type(parent).__name__.lower():
        return "a cross-attention: its k and v read another input than its q"
    if cfg.train:
        return "the training recipe keeps each layer's weight a Parameter of its own"
    if not cfg.is_mx:
        return (f"{cfg.weight} scales each weight by one per-tensor factor: fused, the layers would share one and "
                "their codes would change")
    if hasattr(parent, name):
        return f"the parent already has an attribute {name!r}"
    first = layers[0]
    if any(lin.in_features != first.in_features for lin in layers):
        return "the layers' in_features differ (fused layers must read the same input)"
    if len({lin.bias is None for lin in layers}) > 1:
        return "some of the layers have a bias and some do not"
    if len({(lin.weight.device, lin.weight.dtype) for lin in layers}) > 1:
        return "the layers' weights differ in device or dtype"
    reason = cfg.unquantizable(first.in_features, sum(lin.out_features for lin in layers))
    if reason is not None or any(cfg.unquantizable(lin.in_features, lin.out_features) for lin in layers):
        return reason or "a layer's shape cannot take the config (see its own entry)"
    return None
