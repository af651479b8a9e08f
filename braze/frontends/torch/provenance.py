"""Where an FX node came from: the path of the innermost nn.Module that ran it
(`encoder.layer.3.attention.self.query`), read from torch.export's `nn_module_stack`, with the
spellings older / strict exports use (`L['self'].layers[0]`, `L__self___layers_0`) normalized
to state_dict-style dotted paths."""
from __future__ import annotations

import re

__all__ = ["module_path", "normalize_path", "owner_path"]

_SELF = re.compile(r"^(L\['self'\]|L__self__|self)(\.|_|$)")
_INDEX = re.compile(r"\[(?:'([^']*)'|(\d+))\]")
_GETATTR = re.compile(r"getattr\((.*?), '([^']*)'\)")


def normalize_path(path: str) -> str:
    """`L['self'].layers[0].attn` -> `layers.0.attn`; dotted paths pass through."""
    p = path.strip()
    while True:
        m = _GETATTR.search(p)
        if m is None:
            break
        p = p[:m.start()] + f"{m.group(1)}.{m.group(2)}" + p[m.end():]
    p = _SELF.sub("", p)
    p = _INDEX.sub(lambda m: "." + (m.group(1) if m.group(1) is not None else m.group(2)), p)
    return p.strip(".")


def module_path(node) -> str | None:
    """The innermost module path of FX `node`, or None at the root module (or when the export
    recorded none)."""
    stack = node.meta.get("nn_module_stack") or {}
    for key, entry in reversed(list(stack.items())):
        path = entry[0] if isinstance(entry, tuple) else entry
        if not isinstance(path, str) or "_empty_nn_module_stack" in str(key) + path:
            continue
        p = normalize_path(path)
        return p or None
    return None


def owner_path(state_dict_name: str) -> str:
    """The module owning a parameter or buffer: `layers.0.q_proj.weight` -> `layers.0.q_proj`."""
    return state_dict_name.rpartition(".")[0] or state_dict_name
