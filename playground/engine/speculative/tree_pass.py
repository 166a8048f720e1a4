"""One forward pass over a whole draft tree: the attention mask that lets each node see the context and its own
ancestors only, the position ids of its depth, and the cache trimmed back to the accepted path afterwards.

The model's own mask code returns a 4D mask it is given as it is, so the mask built here must be right for every
layer: full-attention layers see every cached position, a sliding-window layer (Mistral, Gemma 2/3) only the last
``window`` positions before each query, and its cache returns fewer past keys. Models with both kinds of layer
take a dict keyed by layer type (what their own forward builds); the others one tensor.
"""

from __future__ import annotations

from typing import cast

import torch

from playground.config import ConfigError
from playground.engine.speculative.rollback import roll_back
from playground.engine.speculative.tree import DraftTree, ancestors_mask
from playground.models.anatomy import anatomy_of


def _layer_mask(context: int, past: int, tail: int, tree: DraftTree, read: int, window: int | None) -> torch.Tensor:
    """[q, past + q] bool for one layer. The cache holds ``context`` context tokens, then the tree's first ``read``
    nodes; the pass reads ``tail`` more context tokens, then the nodes from ``read`` on; the layer's cache shows
    it its last ``past`` entries (a sliding window shows fewer)."""
    depths = torch.tensor(tree.depths(), dtype=torch.long)
    end = context + tail  # the context's length once the tail is read: a node at depth d is at end + d
    n = len(tree)
    # Every key in cache order (the context, the cached nodes, the pass's inputs): position, and node (-1: context).
    key_pos = torch.cat([torch.arange(end), end + depths[:read], end + depths[read:]])
    key_node = torch.cat([torch.full((end,), -1), torch.arange(n)])
    query_pos = torch.cat([torch.arange(context, end), end + depths[read:]])
    query_node = torch.cat([torch.full((tail,), -1), torch.arange(read, n)])
    shown = slice(len(key_pos) - past - len(query_pos), None)
    key_pos, key_node = key_pos[shown], key_node[shown]
    is_context = key_node < 0
    # A context query (the tail) sees the context up to itself; a node sees the whole context and its ancestors.
    allowed = is_context[None, :] & (key_pos[None, :] <= query_pos[:, None])
    nodes = query_node >= 0
    if n:
        ancestors = ancestors_mask(tree)  # [n, n]
        tree_part = ancestors[query_node.clamp(min=0)][:, key_node.clamp(min=0)] & ~is_context[None, :]
        allowed[nodes] = is_context[None, :].expand(int(nodes.sum()), -1) | tree_part[nodes]
    if window is not None:  # transformers' sliding overlay: key position > query position - window
        allowed &= key_pos[None, :] > query_pos[:, None] - window
    return allowed


def tree_inputs(model, cache, tail: int, tree: DraftTree, device: torch.device, read: int = 0
                ) -> tuple[torch.Tensor | dict[str, torch.Tensor], torch.Tensor]:
    """The attention mask (a float 4D tensor, or a dict of them by layer type) and position ids [1, q] for a pass
    over ``tail`` unread context tokens followed by ``tree``'s nodes from ``read`` on (nodes before ``read`` were
    read by an earlier pass and are the cache's last entries). ``ConfigError`` for a cache this cannot address."""
    if read and tail:
        raise ValueError("a pass reads either the context's tail or more of a tree, not both")
    context = cache.get_seq_length() - read
    depths = tree.depths()
    end = context + tail
    positions = torch.tensor(list(range(context, end)) + [end + d for d in depths[read:]])
    q = len(positions)
    anatomy = anatomy_of(model)  # ConfigError naming a family the seam cannot open
    dtype = cast(torch.Tensor, anatomy.embed.weight).dtype  # the attention's dtype (a first weight may be packed ints)
    if not dtype.is_floating_point:
        dtype = torch.float32
    layers = getattr(cache, "layers", None)
    if not layers:
        raise ConfigError("tree speculation needs a cache with per-layer sizes (a transformers DynamicCache)")
    if read and anatomy.has_sliding_layers:
        # A sliding layer shows a pass only its last window - 1 entries: cached nodes would push out the context
        # positions a new node still sees. Read the whole tree in one pass instead.
        raise ConfigError("a tree cannot be read in parts through a sliding-window cache")

    def mask_for(layer) -> torch.Tensor:
        kv_length, _offset = layer.get_mask_sizes(q)
        allowed = _layer_mask(context, kv_length - q, tail, tree, read, getattr(layer, "sliding_window", None))
        mask = torch.zeros(allowed.shape, dtype=dtype)
        mask.masked_fill_(~allowed, torch.finfo(dtype).min)
        return mask[None, None].to(device)

    types = anatomy.layer_types
    position_ids = positions[None].to(device)
    if len(set(types)) > 1:  # a hybrid model: its forward picks each layer's mask by type
        masks: dict[str, torch.Tensor] = {}
        for layer, kind in zip(layers, types, strict=False):
            if kind not in masks:
                masks[kind] = mask_for(layer)
        return masks, position_ids
    kinds = {(layer.get_mask_sizes(q)[0], getattr(layer, "sliding_window", None)) for layer in layers}
    if len(kinds) > 1:
        raise ConfigError("tree speculation: this model's layers see different spans of the cache, and its forward "
                          "takes one attention mask for all of them")
    return mask_for(layers[0]), position_ids


def keep_path(cache, tree_start: int, path: list[int]) -> None:
    """After a tree pass: keep the cache's positions before ``tree_start`` and the nodes of ``path`` (in order,
    now at ``tree_start`` onwards); drop every other node. The tree's nodes are the last entries of every
    layer's cache, in node order."""
    n_before = cache.get_seq_length()
    nodes = n_before - tree_start
    for layer in cache.layers:
        keys = getattr(layer, "keys", None)
        if keys is None or keys.shape[-2] < nodes:
            raise ConfigError("tree speculation: a cache layer does not hold the tree's nodes (a shared or "
                              "uninitialised layer); draft a chain (--tree-width 1)")
    if path != list(range(len(path))):
        for layer in cache.layers:
            base = layer.keys.shape[-2] - nodes
            index = torch.tensor([base + i for i in path], device=layer.keys.device)
            layer.keys[..., base : base + len(path), :] = layer.keys.index_select(-2, index)
            layer.values[..., base : base + len(path), :] = layer.values.index_select(-2, index)
    roll_back(cache, tree_start + len(path))
