"""--rotary_emb: rotary position embeddings over [<bos>, text, image], DALLE-pytorch's layout.

Rotary embeddings rotate each (even, odd) feature pair of a query and a key by an angle
proportional to the token's position, so a query-key score depends on the two positions
only through their difference. DALLE-pytorch splits the rotated features of a head into
three equal bands of `dim_head // 3` (rounded down to pairs); the rest pass unrotated:

  band 1  text position: <bos> and caption tokens at 0..text_len-1 (frequencies
          1 / 10000^(2i / band)); every image token sits at 8192, far from the text
  band 2  image row:    rows at linspace(-1, 1, fmap) (frequencies pi * linspace(1, 5,
  band 3  image column: columns likewise                band / 2)); text sits at -10 in both

Text-to-text scores thus depend only on the text distance, image-to-image scores only on
the row and column distances, and text and image see each other at a fixed offset. The
learned absolute position embeddings go away (DALLE.text_pos_emb, image_row/col_emb).

Unlike DALLE-pytorch we rotate queries and keys only, not values: rotating values makes
a layer's output depend on absolute positions, which is not what rotary embeddings are
for (RoFormer rotates q and k). A cached decode step rotates its query and key by the
new token's absolute position; the cache holds rotated keys, so cached == uncached.

The angles are a function of the layout and dim_head alone: they are computed per device
on first use, in fp32, and are neither parameters nor checkpointed buffers (a bf16 cast of
the model must not round an angle of 8192 radians).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from dalle_dist.model.patterns import SequenceLayout

#: DALLE-pytorch's position of every image token in the text band: "far away from text".
IMAGE_TEXT_POSITION = 8192.0
#: Its position of every text token in the two image bands (the image spans [-1, 1]).
TEXT_AXIAL_POSITION = -10.0
#: The highest frequency of the image bands is pi * MAX_FREQ / 2 (rotary-embedding-torch's
#: "pixel" frequencies, which DALLE-pytorch uses).
MAX_FREQ = 10.0

#: (cos, signed sin), each [n, dim_head], fp32: rotation_tables' full-width form
Rotation = tuple[Tensor, Tensor]


def band_pairs(dim_head: int) -> int:
    """Feature pairs in each of the three bands (0: dim_head too small to rotate)."""
    return dim_head // 3 // 2


def rotated_features(dim_head: int) -> int:
    return 3 * 2 * band_pairs(dim_head)


def rotary_angles(layout: SequenceLayout, dim_head: int, device: torch.device | str = "cpu"
                  ) -> Tensor:
    """[text_len + image_len, rotated features] rotation angle of every feature of every
    position (each angle twice in a row: one per feature of a pair)."""
    pairs = band_pairs(dim_head)
    band = dim_head // 3
    text_freq = 1.0 / 10000.0 ** (torch.arange(0, 2 * pairs, 2, dtype=torch.float64) / band)
    pixel_freq = torch.linspace(1.0, MAX_FREQ / 2, pairs, dtype=torch.float64) * math.pi
    text, side = layout.text_len, layout.fmap_size
    cells = torch.arange(layout.image_len)
    axis = torch.linspace(-1.0, 1.0, side, dtype=torch.float64)
    text_pos = torch.cat((torch.arange(text, dtype=torch.float64),
                          torch.full((layout.image_len,), IMAGE_TEXT_POSITION,
                                     dtype=torch.float64)))
    row_pos = torch.cat((torch.full((text,), TEXT_AXIAL_POSITION, dtype=torch.float64),
                         axis[cells // side]))
    col_pos = torch.cat((torch.full((text,), TEXT_AXIAL_POSITION, dtype=torch.float64),
                         axis[cells % side]))
    angles = torch.cat((text_pos[:, None] * text_freq, row_pos[:, None] * pixel_freq,
                        col_pos[:, None] * pixel_freq), dim=1)
    return angles.repeat_interleave(2, dim=1).to(device=device, dtype=torch.float32)


def rotation_tables(angles: Tensor, dim_head: int) -> Rotation:
    """(cos, signed sin) [n, dim_head] of rotary_angles' [n, rotated features]: the pair
    (x0, x1) turns into (x0 cos - x1 sin, x1 cos + x0 sin), so the sine carries the sign
    of the feature it multiplies after swap_pairs (- on a pair's first, + on its second),
    and past the rotated features cos is 1 and sin 0. A layer then rotates a whole head
    with two products and a sum, with no slicing of the rotated features out of it or
    concatenation back (bit for bit the same values: a negation is exact, x * 1 + y * 0
    is x)."""
    r = angles.shape[-1]
    cos = F.pad(angles.cos(), (0, dim_head - r), value=1.0)
    sign = torch.tensor([-1.0, 1.0], device=angles.device).repeat(r // 2)
    sin = F.pad(angles.sin() * sign, (0, dim_head - r), value=0.0)
    return cos, sin


class RotaryEmbedding:
    """The rotation of every position of a layout, per device, built once.

    A plain object (not a module): it holds no state a checkpoint or a dtype cast should
    see. The tables live in a dict keyed like the attention masks, which torch.compile
    reads as constants of the compiled decode step.
    """

    def __init__(self, dim_head: int) -> None:
        self.dim_head = dim_head
        self._tables: dict[tuple[SequenceLayout, str], Rotation] = {}

    def tables(self, layout: SequenceLayout, device: torch.device) -> Rotation:
        key = (layout, str(device))
        if key not in self._tables:
            angles = rotary_angles(layout, self.dim_head, device)
            self._tables[key] = rotation_tables(angles, self.dim_head)
        return self._tables[key]

    def at(self, layout: SequenceLayout, n: int, device: torch.device,
           positions: Tensor | None = None) -> Rotation:
        """The rotation of positions 0..n-1, or of the given `positions` [n] (a tensor:
        a compiled decode step must not specialise on it)."""
        cos, sin = self.tables(layout, device)
        if positions is None:
            return cos[:n], sin[:n]
        return cos.index_select(0, positions), sin.index_select(0, positions)


def swap_pairs(t: Tensor) -> Tensor:
    """(x0, x1, x2, x3, ...) -> (x1, x0, x3, x2, ...); an odd last feature stays (its sine
    in rotation_tables is 0)."""
    even = t.shape[-1] // 2 * 2
    pairs = t[..., :even].unflatten(-1, (-1, 2))
    # One stacking copy (flip's kernel, and its backward, cost 1.4 x as much on CPU).
    swapped = torch.stack((pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)
    return swapped if even == t.shape[-1] else torch.cat((swapped, t[..., even:]), dim=-1)


def apply_rotary(t: Tensor, rotation: Rotation) -> Tensor:
    """Rotate t [..., n, dim_head] by rotation_tables' `rotation` ([n, dim_head] each,
    broadcasting over t's leading dimensions), in t's dtype."""
    cos, sin = rotation
    return t * cos.to(t.dtype) + swap_pairs(t) * sin.to(t.dtype)
