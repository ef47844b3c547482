"""--gentxt's text completion: DALLE.complete_text samples what the model predicts, and
caption_ids turns the result into the caption the images are drawn from."""

from __future__ import annotations

import pytest
import torch

from dalle_dist.model import DALLE, DALLEConfig
from dalle_dist.model.sampling import sample_tokens

TEXT_LEN = 8
VOCAB = 20


def tiny_model(attn_types: tuple[str, ...], seed: int = 0) -> DALLE:
    torch.manual_seed(seed)
    model = DALLE(DALLEConfig(num_text_tokens=VOCAB, text_seq_len=TEXT_LEN,
                              num_image_tokens=16, image_fmap_size=4, dim=32, depth=2, heads=2,
                              dim_head=16, attn_types=attn_types)).eval()
    with torch.no_grad():  # sharper text predictions than the 0.02-std init gives
        model.to_logits.weight.mul_(50)
    return model


def reference_completion(model: DALLE, prompt: torch.Tensor, filter_thres: float,
                         generator: torch.Generator) -> torch.Tensor:
    """The plain loop: the sequence so far, and only it, through the model; the next token
    drawn from the last position's text logits."""
    seq = torch.nn.functional.pad(prompt, (1, 0), value=0)  # <bos>
    while seq.shape[1] <= TEXT_LEN:
        h = model.transformer(model._embed_text(seq), model.layout)
        nxt = sample_tokens(model._text_logits(h[:, -1]), filter_thres, 1.0, generator)
        seq = torch.cat((seq, nxt[:, None]), dim=1)
    return seq[:, 1:]


@pytest.mark.parametrize("attn_types", [("full",), ("axial_row", "conv_like")])
def test_completion_is_what_the_model_predicts(attn_types: tuple[str, ...]) -> None:
    """Top-k sampling with a fixed seed equals the plain loop's, and greedy completion
    (one candidate) equals the teacher-forced argmax over the completed text.
    Bug caught: reading the logits one position late (h[:, pos + 1]), which then predict
    from padding."""
    model = tiny_model(attn_types)
    prompt = torch.tensor([[3, 7, 5], [9, 9, 2]])
    got = model.complete_text(prompt, 0.5, 1.0, torch.Generator().manual_seed(0))
    want = reference_completion(model, prompt, 0.5, torch.Generator().manual_seed(0))
    assert torch.equal(got, want)
    assert torch.equal(got[:, :3], prompt)
    greedy = model.complete_text(prompt, 0.99, 1.0, torch.Generator().manual_seed(0))
    full = torch.nn.functional.pad(greedy, (1, 0), value=0)
    with torch.no_grad():
        logits = model._text_logits(model.transformer(model._embed_text(full), model.layout))
    assert torch.equal(greedy[:, 3:], logits[:, 3:-1].argmax(-1))  # position j predicts j + 1
    # The samples are the model's: other weights complete differently.
    assert not torch.equal(greedy, tiny_model(attn_types, seed=1).complete_text(
        prompt, 0.99, 1.0, torch.Generator().manual_seed(0)))


def test_empty_and_full_prompts() -> None:
    model = tiny_model(("full",))
    from_nothing = model.complete_text(torch.zeros(1, 0, dtype=torch.long), 0.5, 1.0,
                                       torch.Generator().manual_seed(0))
    assert from_nothing.shape == (1, TEXT_LEN)
    full = torch.arange(1, TEXT_LEN + 1)[None]
    assert torch.equal(model.complete_text(full, 0.5), full)


def test_caption_ids_drop_padding_slots_and_bos() -> None:
    """Model text ids: 1..VOCAB-1 caption tokens, VOCAB + i the padding slot of position i
    (sampled anywhere), 0 <bos>. Bug caught: padding slots kept as caption tokens."""
    model = tiny_model(("full",))
    pad = VOCAB
    ids = torch.tensor([[4, pad + 3, 6, 0, 7, pad, pad + 6, pad + 7],
                        [1, 2, 3, 4, 5, 6, 7, 8]])
    assert model.caption_ids(ids).tolist() == [[4, 6, 7, 0, 0, 0, 0, 0],
                                                [1, 2, 3, 4, 5, 6, 7, 8]]
