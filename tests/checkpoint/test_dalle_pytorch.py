"""`checkpoint import` and `checkpoint export --format dalle-pytorch` against DALLE-pytorch
1.6.6 itself (tests/checkpoint/dalle_pytorch_reference.py): its models, built across its
options and saved as its train_dalle.py / train_vae.py save them, must compute in ours
what they compute in it, and keep training as they would have.

Bugs these fail on (each was run once): a LayerScale vector dropped or put on the other
branch; values left unrotated; GEGLU's value and gate halves swapped; the final norm
read from the wrong key; conv_like's window centred on the query (dalle_dist's before
this import); the Adam state paired with parameters by our order instead of theirs; a
shared module's repeats counted as parameters of their own.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from dalle_dist.backends.optim_state import optimizer_state_by_index
from dalle_dist.checkpoint.dalle_pytorch import import_file, write_import
from dalle_dist.checkpoint.dalle_pytorch_export import export_dalle_pytorch, write_export
from dalle_dist.checkpoint.format import write_checkpoint_file
from dalle_dist.model.config import DALLEConfig, VAEConfig
from dalle_dist.model.dalle import DALLE
from dalle_dist.model.vae import DiscreteVAE
from tests.checkpoint.dalle_pytorch_reference import dalle_pytorch, saved_like_train_dalle
from tests.conftest import assert_user_error, run_cli

VOCAB, TEXT_LEN = 50, 8
VAE_PARAMS = {"image_size": 32, "num_layers": 2, "num_tokens": 64, "codebook_dim": 24,
              "hidden_dim": 16, "num_resnet_blocks": 0}
BASE = {"num_text_tokens": VOCAB, "text_seq_len": TEXT_LEN, "dim": 32, "depth": 4,
        "heads": 2, "dim_head": 12, "reversible": False, "loss_img_weight": 7,
        "attn_types": ("full",), "ff_dropout": 0.0, "attn_dropout": 0.0, "stable": False,
        "shift_tokens": False, "rotary_emb": False, "shared_attn_ids": None,
        "shared_ff_ids": None, "share_input_output_emb": False}
#: (name, hparams over BASE (train_dalle.py's keys), VAE resnet blocks)
COMBOS = [
    ("train_dalle_defaults", {}, 0),  # rotary and shift off, as its script builds it
    ("class_defaults_rotary_shift", {"rotary_emb": True, "shift_tokens": True}, 1),
    ("axial", {"attn_types": ("axial_row", "axial_col"), "rotary_emb": True,
               "shift_tokens": True}, 0),
    ("conv_like", {"attn_types": ("conv_like", "full")}, 2),
    ("shared_and_tied", {"shared_attn_ids": (0, 0, 1, 1), "shared_ff_ids": (0, 1, 0, 1),
                         "share_input_output_emb": True}, 0),
    ("cycled_ids_dropout", {"shared_attn_ids": (7,), "ff_dropout": 0.1,
                            "attn_dropout": 0.1, "rotary_emb": True}, 0),
    ("stable_every_pattern", {"stable": True, "rotary_emb": True, "shift_tokens": True,
                              "attn_types": ("full", "axial_row", "conv_like", "axial_col")}, 1),
]


def _their_model(hparams: dict[str, Any], blocks: int, seed: int = 0) -> torch.nn.Module:
    """Their DALLE with every weight moved off its initial value (LayerScale at 0.1 and
    norms at one would hide a scale or a norm read from the wrong key)."""
    dp = dalle_pytorch()
    torch.manual_seed(seed)
    vae = dp.DiscreteVAE(**{**VAE_PARAMS, "num_resnet_blocks": blocks})
    model = dp.DALLE(vae=vae, **hparams)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.requires_grad and (name.endswith(".scale") or ".norm." in name
                                    or name.startswith("to_logits.0")):
                p.add_(torch.randn_like(p) * 0.3)
    return model


def _batch(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    text = torch.randint(1, VOCAB, (3, TEXT_LEN), generator=g)
    text[0, 5:] = 0  # padding: each slot becomes its own token
    text[1, 2:] = 0
    return text, torch.randint(0, VAE_PARAMS["num_tokens"], (3, 64), generator=g)


def _our_logits(model: DALLE, text: torch.Tensor, image: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """(text logits over the text vocabulary, image logits over the image one), as
    DALLE.forward computes them for its loss."""
    x = torch.cat((model._embed_text(model._text_input(text)),
                   model._embed_image(image[:, :-1])), dim=1)
    h = model.transformer(x, model.layout)
    n = model.layout.text_len - 1
    return model._text_logits(h[:, :n]), model._image_logits(h[:, n:])


def _ours(payload: dict[str, Any]) -> DALLE:
    model = DALLE(DALLEConfig.from_dict(payload["configs"]["model"]))
    model.load_state_dict(payload["weights"])
    return model


def _their_resumed(src: Path) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """Their model and Adam from their file, as train_dalle.py resumes (--dalle_path)."""
    dp = dalle_pytorch()
    saved = torch.load(src, weights_only=True)
    model = dp.DALLE(vae=dp.DiscreteVAE(**saved["vae_params"]), **saved["hparams"])
    model.load_state_dict(saved["weights"])
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1.0)
    opt.load_state_dict(saved["opt_state"])
    return model, opt


def _their_parameters(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}


@pytest.fixture(scope="module", params=COMBOS, ids=[c[0] for c in COMBOS])
def imported(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
             ) -> dict[str, Any]:
    """One of their models after one Adam step (so its optimizer state is not empty),
    saved as train_dalle.py saves it, with LR-plateau state, and imported."""
    name, extra, blocks = request.param
    hparams = {**BASE, **extra}
    theirs = _their_model(hparams, blocks)
    opt = torch.optim.Adam([p for p in theirs.parameters() if p.requires_grad], lr=1e-3)
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, factor=0.5, patience=10,
                                                         cooldown=10, min_lr=1e-6)
    text, image = _batch(1)
    theirs.train()
    theirs(text.clone(), image, return_loss=True).backward()
    opt.step()
    opt.zero_grad()
    plateau.step(2.5)
    folder = tmp_path_factory.mktemp(name)
    src, out = folder / "dalle.pt", folder / "imported.pt"
    torch.save(saved_like_train_dalle(theirs, hparams, {**VAE_PARAMS,
                                                         "num_resnet_blocks": blocks},
                                      opt, plateau, epoch=2), src)
    write_import(src, out)
    payload = torch.load(out, weights_only=True)
    return {"name": name, "hparams": hparams, "theirs": theirs, "plateau": plateau,
            "payload": payload, "src": src}


def test_imported_logits_and_loss_equal_dalle_pytorchs(imported: dict[str, Any]) -> None:
    theirs, payload = imported["theirs"].eval(), imported["payload"]
    ours = _ours(payload).eval()
    assert payload["configs"]["model"]["layer_scale"] is True
    assert payload["configs"]["model"]["rotate_values"] == imported["hparams"]["rotary_emb"]
    text, image = _batch(2)
    with torch.no_grad():
        their_logits = theirs(text.clone(), image)
        text_logits, image_logits = _our_logits(ours, text, image)
        their_loss = theirs(text.clone(), image, return_loss=True)
        our_loss = ours(text, image)["loss"]
    n, vocab = TEXT_LEN, ours.text_vocab
    torch.testing.assert_close(text_logits, their_logits[:, :n, :vocab], rtol=1e-5, atol=2e-5)
    torch.testing.assert_close(image_logits, their_logits[:, n:, vocab:], rtol=1e-5,
                               atol=2e-5)
    torch.testing.assert_close(our_loss, their_loss, rtol=1e-5, atol=1e-6)
    # the comparison sees the model: another caption moves the logits
    assert (image_logits - _our_logits(ours, _batch(3)[0], image)[1]).abs().max() > 1e-3


def test_imported_adam_state_continues_as_dalle_pytorchs(imported: dict[str, Any]) -> None:
    """One more step on each side from the imported state: theirs with its own Adam,
    ours with the mapped moments and step counts (in eval mode: the two models draw
    dropout differently): the weights agree after."""
    payload = imported["payload"]
    theirs, opt = _their_resumed(imported["src"])
    assert payload["optimizer"] is not None
    assert payload["scheduler"]["best"] == imported["plateau"].state_dict()["best"] == 2.5
    ours = _ours(payload)
    our_opt = torch.optim.Adam(ours.parameters(), lr=1.0)
    our_opt.load_state_dict(optimizer_state_by_index(payload["optimizer"], ours, our_opt))
    assert our_opt.param_groups[0]["lr"] == opt.param_groups[0]["lr"]
    text, image = _batch(4)
    before = {k: v.clone() for k, v in _their_parameters(theirs).items()}
    for model, optimizer, loss in (
            (theirs, opt, lambda: theirs(text.clone(), image, return_loss=True)),
            (ours, our_opt, lambda: ours(text, image)["loss"])):
        model.eval()
        loss().backward()
        optimizer.step()
        optimizer.zero_grad()
    exported = export_dalle_pytorch({**payload, "weights": ours.state_dict()})["weights"]
    moved = 0
    for name, value in _their_parameters(theirs).items():
        torch.testing.assert_close(exported[name], value, rtol=1e-5, atol=1e-6,
                                   msg=lambda m, name=name: f"{name}: {m}")
        moved += int(not torch.equal(value, before[name]))
    assert moved == len(before)


def test_export_gives_their_weights_back(imported: dict[str, Any]) -> None:
    """theirs -> ours -> theirs: every tensor of their state dict, bit for bit (the rotary
    angles buffer: ours, computed in fp64, within fp32 rounding)."""
    theirs = torch.load(imported["src"], weights_only=True)["weights"]  # the VAE's too
    back = export_dalle_pytorch(imported["payload"])
    assert back["hparams"]["rotary_emb"] == imported["hparams"]["rotary_emb"]
    assert set(back["weights"]) == set(theirs)
    for key, value in theirs.items():
        if key == "transformer.pos_emb":
            torch.testing.assert_close(back["weights"][key], value, rtol=0, atol=2e-3)
        else:
            assert torch.equal(back["weights"][key], value), key


def test_imported_cached_sampling_equals_uncached(imported: dict[str, Any]) -> None:
    ours = _ours(imported["payload"]).eval()
    text = _batch(5)[0][:2]
    cached = ours.sample_image_tokens(text, 0.5, 1.0, torch.Generator().manual_seed(3))
    plain = ours.sample_image_tokens(text, 0.5, 1.0, torch.Generator().manual_seed(3),
                                     use_cache=False)
    assert torch.equal(cached, plain)


@pytest.mark.parametrize("blocks", [0, 2])
def test_imported_vae_gives_their_codes_and_images(blocks: int, tmp_path: Path) -> None:
    """A train_vae.py vae.pt: the same codebook indices for the same images, and the same
    decoded images (theirs leave the decoder in [-1, 1], ours in [0, 1])."""
    dp = dalle_pytorch()
    torch.manual_seed(blocks)
    params = {**VAE_PARAMS, "num_resnet_blocks": blocks}
    theirs = dp.DiscreteVAE(**params).eval()
    src = tmp_path / "vae.pt"
    torch.save({"hparams": params, "weights": theirs.state_dict()}, src)
    write_import(src, tmp_path / "ours.pt")
    payload = torch.load(tmp_path / "ours.pt", weights_only=True)
    assert payload["kind"] == "vae"
    ours = DiscreteVAE(VAEConfig.from_dict(payload["configs"]["model"])).eval()
    ours.load_state_dict(payload["weights"])
    images = torch.rand(4, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    codes = theirs.get_codebook_indices(images)
    assert torch.equal(ours.get_codebook_indices(images), codes)
    assert codes.unique().numel() > 4  # the comparison sees more than one code
    with torch.no_grad():
        want = ((theirs.decode(codes) + 1) * 0.5).clamp(0, 1)
        torch.testing.assert_close(ours.decode(codes), want, rtol=1e-5, atol=1e-5)


def _native_payload(seed: int = 0, model: dict[str, Any] | None = None,
                    vae: dict[str, Any] | None = None) -> dict[str, Any]:
    """A model of ours, as `train` saves it, with what both projects have: shifted tokens,
    axial and conv_like layers, shared attention, tied embeddings, a VAE with resnet
    blocks; weights drawn off their initial values."""
    vae_config = VAEConfig(image_size=32, num_layers=2, num_tokens=64, codebook_dim=24,
                           hidden_dim=16, **{"num_resnet_blocks": 1, **(vae or {})})
    config = DALLEConfig(num_text_tokens=257, text_seq_len=TEXT_LEN, num_image_tokens=64,
                         image_fmap_size=8, dim=32, depth=4, heads=2, dim_head=12,
                         attn_types=("axial_row", "conv_like"), shift_tokens=True,
                         shared_attn_ids=("a", "b", "a", "c"), share_input_output_emb=True,
                         **(model or {}))
    torch.manual_seed(seed)
    model, vae = DALLE(config), DiscreteVAE(vae_config)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return {"format_version": 1, "kind": "dalle", "package_version": "test",
            "configs": {"model": config.to_dict(), "vae": vae_config.to_dict(),
                        "tokenizer": {"kind": "byte"}},
            "epoch": 1, "step": 7, "batch": 0, "loss_sum": 0.0, "samples": 0, "rng": [],
            "backend": "single", "world_size": 1, "weights": model.state_dict(),
            "vae_weights": vae.state_dict(), "optimizer": None, "scheduler": None}


def test_ours_to_dalle_pytorch_and_back_is_bit_identical(tmp_path: Path) -> None:
    """Our model -> `export --format dalle-pytorch` -> loaded as 1.6.6's generate.py loads
    it (strict load_state_dict), same logits there, and it samples -> `import` -> our
    weights, configs and tokenizer again, bit for bit."""
    dp = dalle_pytorch()
    native = _native_payload()
    source, exported, back = tmp_path / "ours.pt", tmp_path / "dalle.pt", tmp_path / "back.pt"
    write_checkpoint_file(source, native)
    write_export(source, exported)
    loaded = torch.load(exported, weights_only=True)  # torch 2.6+'s default in generate.py
    hparams, vae_params, weights = (loaded.pop("hparams"), loaded.pop("vae_params"),
                                    loaded.pop("weights"))
    assert loaded.pop("vae_class_name") == "DiscreteVAE"
    assert loaded.pop("version") == "1.6.6"
    theirs = dp.DALLE(vae=dp.DiscreteVAE(**vae_params), **hparams).eval()
    theirs.load_state_dict(weights)  # strict: every key theirs has, no other
    text, image = _batch(6)
    ours = _ours(native).eval()
    with torch.no_grad():
        their_logits = theirs(text.clone(), image)
        text_logits, image_logits = _our_logits(ours, text, image)
        images = theirs.generate_images(text[:1], filter_thres=0.9)
    torch.testing.assert_close(image_logits, their_logits[:, TEXT_LEN:, ours.text_vocab:],
                               rtol=1e-5, atol=2e-5)
    torch.testing.assert_close(text_logits, their_logits[:, :TEXT_LEN, :ours.text_vocab],
                               rtol=1e-5, atol=2e-5)
    assert images.shape == (1, 3, 32, 32)

    write_import(exported, back)
    again = torch.load(back, weights_only=True)
    assert again["configs"]["model"] == native["configs"]["model"]  # no LayerScale added
    assert again["configs"]["vae"] == native["configs"]["vae"]
    assert again["configs"]["tokenizer"] == {"kind": "byte"}
    for part in ("weights", "vae_weights"):
        assert again[part].keys() == native[part].keys()
        for key, value in native[part].items():
            assert torch.equal(again[part][key], value), (part, key)


def test_what_dalle_pytorch_cannot_say_is_not_exported(tmp_path: Path) -> None:
    """Rotary embeddings on queries and keys only (ours) and a VAE with a decoder stem but
    no resnet blocks (ours) have no DALLE-pytorch form: refused, nothing written."""
    for name, payload, fragment in (
            ("rotary", _native_payload(model={"rotary_emb": True}),
             "rotary embeddings on queries"),
            ("stem", _native_payload(vae={"num_resnet_blocks": 0}), "1x1 convolution")):
        source, out = tmp_path / f"{name}.pt", tmp_path / f"{name}-dp.pt"
        write_checkpoint_file(source, payload)
        result = run_cli("checkpoint", "export", str(source), str(out), "--format",
                         "dalle-pytorch")
        assert_user_error(result, fragment, "DALLE-pytorch 1.6.6 cannot represent")
        assert not out.exists()


def _hand_made(tmp_path: Path, name: str, hparams: dict[str, Any], top: dict[str, Any]
               ) -> Path:
    """A dalle.pt as train_dalle.py lays it out (no weights needed: each refusal comes
    before they are read), with `hparams` and top-level keys `top` changed."""
    obj = {"hparams": {**BASE, **hparams}, "vae_params": dict(VAE_PARAMS), "epoch": 0,
           "version": "1.6.6", "vae_class_name": "DiscreteVAE", "weights": {},
           "opt_state": None, "scheduler_state": None, **top}
    path = tmp_path / f"{name}.pt"
    torch.save(obj, path)
    return path


@pytest.mark.parametrize("case", [
    ("reversible", {"reversible": True}, {}, [], "reversible=True"),
    ("sandwich", {"sandwich_norm": True}, {}, [], "sandwich_norm=True"),
    ("unknown_option", {"new_option": 1}, {}, [], "option new_option"),
    ("openai_vae", {}, {"vae_params": None, "vae_class_name": "OpenAIDiscreteVAE"}, [],
     "OpenAI's pretrained dVAE"),
    ("vqgan", {}, {"vae_params": None, "vae_class_name": "VQGanVAE"}, [], "taming VQGAN"),
    ("deepspeed_aux", {}, {"weights": "To get a working standard checkpoint, look into"},
     [], "auxiliary file of a DALLE-pytorch DeepSpeed checkpoint"),
    ("hug", {}, {}, ["--hug", "--bpe_path", "tokenizer.json"], "--hug"),
    ("vocab", {}, {}, ["--chinese"], "the model has 50 text tokens"),
], ids=lambda c: c[0])
def test_import_refusals_are_one_line_and_write_nothing(case: tuple, tmp_path: Path) -> None:
    name, hparams, top, flags, fragment = case
    source = _hand_made(tmp_path, name, hparams, top)
    out = tmp_path / "out.pt"
    result = run_cli("checkpoint", "import", str(source), str(out), *flags)
    assert_user_error(result, fragment)
    assert not out.exists()


def test_import_refuses_a_file_that_needs_code_and_a_file_of_ours(tmp_path: Path) -> None:
    pickled = tmp_path / "pickled.pt"
    torch.save({"hparams": {"dim": 8}, "weights": {}, "vae": torch.nn.Linear(2, 2)}, pickled)
    result = run_cli("checkpoint", "import", str(pickled), str(tmp_path / "a.pt"))
    assert_user_error(result, "carries pickled Python objects", "refused unread")
    ours = tmp_path / "ours.pt"
    write_checkpoint_file(ours, _native_payload())
    result = run_cli("checkpoint", "import", str(ours), str(tmp_path / "b.pt"))
    assert_user_error(result, "is not a DALLE-pytorch dalle.pt or vae.pt")
    assert not (tmp_path / "a.pt").exists() and not (tmp_path / "b.pt").exists()


def test_a_model_on_a_taming_vqgan_imports_with_that_vqgan(tmp_path: Path) -> None:
    """A VQGanVAE-based dalle.pt carries the VQGAN's weights (and its loss's) but not its
    config: the import takes the VQGAN's files, as DALLE-pytorch's generate.py --taming
    does, checks them against the carried copy, and the DALL-E then samples on it. Built
    around the real taming fixture (tests/fixtures/vqgan) in a stand-in VQGanVAE, whose
    own constructor needs omegaconf and taming."""
    import copy

    from dalle_dist.checkpoint.taming import TamingConfig, load_vqgan
    from dalle_dist.errors import CheckpointError

    dp = dalle_pytorch()
    fixture = Path(__file__).resolve().parents[1] / "fixtures" / "vqgan"
    flags = TamingConfig(vqgan_model_path=str(fixture / "tiny_vqgan.ckpt"),
                         vqgan_config_path=str(fixture / "tiny_vqgan.yaml"))
    vqgan = load_vqgan(flags.vqgan_model_path, flags.vqgan_config_path)
    theirs_vae = dp.VQGanVAE.__new__(dp.VQGanVAE)
    torch.nn.Module.__init__(theirs_vae)
    theirs_vae.model = copy.deepcopy(vqgan)
    theirs_vae.model.loss = torch.nn.Linear(2, 2)  # taming's VQModel keeps its loss's weights
    theirs_vae.image_size = vqgan.config.resolution
    theirs_vae.num_layers = len(vqgan.config.ch_mult) - 1
    theirs_vae.num_tokens, theirs_vae.channels = vqgan.config.n_embed, 3
    hparams = {**BASE, "num_text_tokens": 257, "rotary_emb": True, "shift_tokens": True}
    torch.manual_seed(0)
    theirs = dp.DALLE(vae=theirs_vae, **hparams).eval()
    saved = saved_like_train_dalle(theirs, hparams, None, vae_class_name="VQGanVAE")
    src, out = tmp_path / "dalle.pt", tmp_path / "ours.pt"
    torch.save(saved, src)

    with pytest.raises(CheckpointError, match="trained on a taming VQGAN"):
        import_file(src)
    payload = import_file(src, taming=flags).payload
    assert payload["configs"]["vae"] == vqgan.config.to_dict()
    assert payload["vae_weights"].keys() == vqgan.state_dict().keys()
    fmap = vqgan.config.fmap_size
    text = _batch(7)[0]
    image = torch.randint(0, vqgan.config.n_embed, (3, fmap * fmap))
    with torch.no_grad():
        their_logits = theirs(text.clone(), image)
        _, image_logits = _our_logits(_ours(payload).eval(), text, image)
    torch.testing.assert_close(image_logits, their_logits[:, TEXT_LEN:, 257 + TEXT_LEN:],
                               rtol=1e-5, atol=2e-5)

    write_import(src, out, taming=flags)
    result = run_cli("generate", "--dalle_path", str(out), "--text", "a circle",
                     "--num_images", "1", "--outputs_dir", str(tmp_path / "gen"))
    assert result.returncode == 0, result.stderr
    assert list((tmp_path / "gen").rglob("*.png"))

    other = copy.deepcopy(saved)
    name = next(k for k in other["weights"] if k.startswith("vae.model.encoder."))
    other["weights"][name] = other["weights"][name] + 1e-3
    torch.save(other, src)
    result = run_cli("checkpoint", "import", str(src), str(tmp_path / "no.pt"),
                     "--vqgan_model_path", flags.vqgan_model_path, "--vqgan_config_path",
                     flags.vqgan_config_path)
    assert_user_error(result, f"its VQGAN weight {name} differs")
    assert not (tmp_path / "no.pt").exists()


def test_a_model_on_the_default_clip_tokenizer_reads_captions_as_trained(tmp_path: Path
                                                                         ) -> None:
    """DALLE-pytorch's default tokenizer (CLIP's BPE, 49408 ids) is not saved in its files:
    the import finds its merges file in the installed DALLE-pytorch and carries it, so the
    checkpoint turns a caption into the ids DALLE-pytorch's tokenizer gives, and the logits
    for that caption are theirs."""
    from dalle_dist.checkpoint.load import dalle_parts
    from dalle_dist.data.tokenizer import tokenize
    from tests.checkpoint.dalle_pytorch_reference import simple_tokenizer

    hparams = {**BASE, "num_text_tokens": 49408, "depth": 2}
    theirs = _their_model(hparams, 0).eval()
    src = tmp_path / "dalle.pt"
    torch.save(saved_like_train_dalle(theirs, hparams, VAE_PARAMS), src)
    imported = import_file(src)
    assert imported.payload["configs"]["tokenizer"]["kind"] == "clip"
    assert any("read from its install" in note for note in imported.notes), imported.notes
    _, _, tokenizer = dalle_parts(imported.payload)
    caption = "A Small red circle, left!"
    text = tokenize(tokenizer, [caption], TEXT_LEN)
    assert torch.equal(text, simple_tokenizer().tokenize([caption], TEXT_LEN))
    image = _batch(8)[1][:1]
    with torch.no_grad():
        their_logits = theirs(text.clone(), image)
        _, image_logits = _our_logits(_ours(imported.payload).eval(), text, image)
    torch.testing.assert_close(image_logits, their_logits[:, TEXT_LEN:, 49408 + TEXT_LEN:],
                               rtol=1e-5, atol=2e-5)
