"""--rotary_emb and --shift_tokens (model/rotary.py, model/shift.py).

Cached decoding (the StaticDecoder) must equal the uncached reference with each option on
and both, for the default pattern and for all five patterns cycled (the sparse and band
paths; the compiled StaticDecoder runs with both on in test_sampling's one compile test);
rotary scores must depend only on position differences, on the model's real attention
path; the shift must follow DALLE-pytorch's per-position rule.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from dalle_dist.model import SequenceLayout
from dalle_dist.model.decoding import StaticDecoder
from dalle_dist.model.rotary import (
    apply_rotary,
    rotary_angles,
    rotated_features,
    rotation_tables,
)
from dalle_dist.model.shift import shift_sequence
from tests.model.test_sampling import SMALL, _captions, assert_cached_sampling_is_uncached
from tests.model.test_sampling import _small_model as _model

OPTIONS = {"rotary": {"rotary_emb": True}, "shift": {"shift_tokens": True},
           "both": {"rotary_emb": True, "shift_tokens": True}}
PATTERNS = {"full": ("full",), "all5": ("full", "axial_row", "axial_col", "conv_like", "sparse")}


pytestmark = pytest.mark.usefixtures("one_thread")




# -- cached == uncached ---------------------------------------------------------------

@pytest.mark.parametrize("patterns", list(PATTERNS))
@pytest.mark.parametrize("option", list(OPTIONS))
def test_cached_decoding_equals_uncached(option: str, patterns: str) -> None:
    """Teacher-forced: the logits of every image cell from prefill + one decode step per
    cell equal those of the whole sequence through the training path; then sampled tokens
    are equal, with one decoder reused for two batches (stale shift rows must not leak).

    Bugs (each seen failing): the decode step's query rotated at its cell instead of its
    absolute position (cell + text_len); the shift row read after the new cell overwrote
    its slot (the cell above became the cell itself); the left neighbour taken across a
    row boundary (no zeroing at column 0).
    """
    model = _model(PATTERNS[patterns], **OPTIONS[option])
    layout = model.layout
    text = _captions(3)
    image = torch.randint(0, SMALL.num_image_tokens, (3, layout.image_len),
                          generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        x = torch.cat((model._embed_text(model._text_input(text)),
                       model._embed_image(image[:, :-1])), dim=1)
        want = model._image_logits(model.transformer(x, layout)[:, layout.text_len - 1:])
        decoder = StaticDecoder(model, 3)
        got = [model.prefill(text, decoder.caches)]
        for j in range(layout.image_len - 1):
            got.append(model.decode_step(image[:, j:j + 1], decoder.cells[j:j + 1],
                                         decoder.caches))
    torch.testing.assert_close(torch.stack(got, dim=1), want, rtol=1e-5, atol=1e-5)

    assert_cached_sampling_is_uncached(model, decoder, _captions)


# -- rotary ---------------------------------------------------------------------------

def test_rotary_angles_follow_dalle_pytorch_layout() -> None:
    """Three bands of dim_head // 3 features (pairs only): text positions 0.. in band 1
    (image at 8192), linspace(-1, 1) rows and columns in bands 2 and 3 (text at -10).
    Bug: bands swapped, or the image given text positions after the caption."""
    layout = SequenceLayout(text_len=5, fmap_size=3)
    angles = rotary_angles(layout, 20, "cpu").double()  # band 6 -> 3 pairs, 18 features
    assert angles.shape == (5 + 9, rotated_features(20)) == (14, 18)
    text_freq = 1.0 / 10000.0 ** (torch.arange(0, 6, 2).double() / 6)
    pixel_freq = torch.linspace(1.0, 5.0, 3).double() * math.pi
    pairs = angles[:, ::2]
    assert torch.equal(angles[:, ::2], angles[:, 1::2])  # one angle per feature pair
    torch.testing.assert_close(pairs[3, :3], 3 * text_freq)
    torch.testing.assert_close(pairs[3, 3:6], -10 * pixel_freq)
    cell = 5 + 7  # row 2, column 1
    torch.testing.assert_close(pairs[cell, :3], 8192 * text_freq)
    torch.testing.assert_close(pairs[cell, 3:6], 1.0 * pixel_freq, rtol=1e-6, atol=1e-4)
    torch.testing.assert_close(pairs[cell, 6:9], 0.0 * pixel_freq, rtol=1e-6, atol=1e-4)


class _RecordSdpa(TorchFunctionMode):
    """The (q, k) of every scaled_dot_product_attention call."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[torch.Tensor, torch.Tensor]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if func is F.scaled_dot_product_attention:
            self.calls.append((args[0].detach(), args[1].detach()))
        return func(*args, **(kwargs or {}))


def test_rotary_scores_depend_only_on_position_differences() -> None:
    """On the model's own path: a caption of one repeated token and an image of one
    repeated token give every position the same raw q and k in the first layer (rotary
    replaces the learned positions); the scores SDPA receives must then depend only on
    i - j between text positions and on (row, column) differences between image cells,
    and must vary with them. Bugs: the rotation never reaching attention (constant
    scores); rotating with absolute learned positions still added (not relative)."""
    model = _model(("full",), rotary_emb=True)
    assert model.text_pos_emb is None and model.image_row_emb is None
    assert not [n for n, _ in model.named_parameters() if "pos" in n or "row" in n]
    layout, side = model.layout, SMALL.image_fmap_size
    text = torch.full((1, SMALL.text_seq_len), 5)
    image = torch.full((1, layout.image_len), 3)
    recorder = _RecordSdpa()
    with torch.no_grad(), recorder:
        model(text, image)
    q, k = recorder.calls[0]
    scores = (q @ k.transpose(-1, -2))[0, 0].double()  # [n, n], first head
    t = layout.text_len
    caption = scores[1:t, 1:t]  # position 0 is <bos>, another token
    torch.testing.assert_close(caption[1:, 1:], caption[:-1, :-1], rtol=0, atol=1e-5)
    assert (caption[2:, 0] - caption[1:-1, 0]).abs().max() > 1e-3
    cells = scores[t:, t:]  # image cells 0 .. image_len - 2
    n = cells.shape[0]
    for a in range(n):
        for b in range(n):
            ra, ca, rb, cb = a // side, a % side, b // side, b % side
            if ra >= 1 and rb >= 1:  # one row up: same differences
                assert math.isclose(cells[a, b], cells[a - side, b - side], abs_tol=1e-4)
            if ca >= 1 and cb >= 1:  # one column left
                assert math.isclose(cells[a, b], cells[a - 1, b - 1], abs_tol=1e-4)
    assert (cells[0] - cells[0, 0]).abs().max() > 1e-3


def test_rotation_keeps_norms_and_passes_the_rest() -> None:
    """A rotation: norms kept, features past the three bands unchanged, and the angle of
    a pair what the table says. Bug: pairs taken as halves (x_i with x_{i+d/2})."""
    layout = SequenceLayout(text_len=4, fmap_size=2)
    angles = rotary_angles(layout, 16)  # 12 rotated features, 4 passed
    t = torch.randn(1, 1, 8, 16, dtype=torch.float64)
    out = apply_rotary(t, tuple(x.double() for x in rotation_tables(angles, 16)))
    torch.testing.assert_close(out.norm(dim=-1), t.norm(dim=-1))
    assert torch.equal(out[..., 12:], t[..., 12:])
    a = angles[2, 0].double()
    x0, x1 = t[0, 0, 2, 0], t[0, 0, 2, 1]
    torch.testing.assert_close(out[0, 0, 2, :2],
                               torch.stack((x0 * a.cos() - x1 * a.sin(),
                                            x1 * a.cos() + x0 * a.sin())))


# -- token shift ----------------------------------------------------------------------

@pytest.mark.parametrize("n_image", [16, 6])  # a full grid and a partial one (mid row)
def test_shift_follows_dalle_pytorch_rule(n_image: int) -> None:
    """Against a per-position statement of PreShiftToken: text takes its first half from
    the previous position, an image cell its first quarter from the cell above and its
    second from the cell to the left, zeros at the edges; dim 10 gives torch.chunk's
    uneven sizes (5 | 5 and 3, 3 | 4). Bug: the left neighbour of column 0 taken from the
    end of the row above; the first image cell's left taken from the last text token."""
    layout = SequenceLayout(text_len=5, fmap_size=4)
    d, half, quarter = 10, 5, 3
    x = torch.randn(2, layout.text_len + n_image, d)
    want = x.clone()
    for p in range(x.shape[1]):
        if p < layout.text_len:
            want[:, p, :half] = x[:, p - 1, :half] if p > 0 else 0
            continue
        cell = p - layout.text_len
        row, col = divmod(cell, 4)
        want[:, p, :quarter] = x[:, p - 4, :quarter] if row > 0 else 0
        want[:, p, quarter:2 * quarter] = x[:, p - 1, quarter:2 * quarter] if col > 0 else 0
    assert torch.equal(shift_sequence(x, layout), want)
