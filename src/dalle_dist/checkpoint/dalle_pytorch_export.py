"""`checkpoint export --format dalle-pytorch`: a checkpoint of ours as the dalle.pt that
DALLE-pytorch 1.6.6's generate.py loads (strict load_state_dict), or the vae.pt its
train_dalle.py --vae_path takes; what 1.6.6 cannot represent is refused in one line
(docs/from-dalle-pytorch.md). The inverse of checkpoint/dalle_pytorch.py's import.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from dalle_dist.checkpoint.dalle_pytorch_layout import (
    REFERENCE_VERSION,
    TOKENIZER_KEY,
    rotary_table,
    their_vae_keys,
)
from dalle_dist.checkpoint.format import write_checkpoint_file
from dalle_dist.errors import CheckpointError
from dalle_dist.model.config import DALLEConfig, VAEConfig


def _export_refusal(what: str) -> CheckpointError:
    return CheckpointError(f"PATH: {what}, which DALLE-pytorch {REFERENCE_VERSION} cannot "
                           "represent", "only the options both have export")


def their_vae_params(config: VAEConfig) -> dict[str, Any]:
    """DiscreteVAE(**vae_params) for our VAEConfig (train_vae.py's keys and the rest that
    differ from its defaults), or a refusal."""
    if config.decoder_stem != (config.num_resnet_blocks > 0):
        raise _export_refusal("a VAE whose decoder opens with a 1x1 convolution and has no "
                              "resnet blocks")
    params = {"image_size": config.image_size, "num_layers": config.num_layers,
              "num_tokens": config.num_tokens, "codebook_dim": config.codebook_dim,
              "hidden_dim": config.hidden_dim, "num_resnet_blocks": config.num_resnet_blocks}
    if config.channels != 3:
        params["channels"] = config.channels
    if config.smooth_l1_loss:
        params["smooth_l1_loss"] = True
    if config.straight_through:
        params["straight_through"] = True
    if config.kl_loss_weight:
        params["kl_div_loss_weight"] = config.kl_loss_weight
    return params


def their_hparams(config: DALLEConfig) -> dict[str, Any]:
    """train_dalle.py's dalle_params for our DALLEConfig, or a refusal naming what 1.6.6
    has no way to say."""
    if config.ff_mult != 4:
        raise _export_refusal(f"--ff_mult {config.ff_mult} (its feed-forward is 4 x dim)")
    if config.rotary_emb and not config.rotate_values:
        raise _export_refusal("rotary embeddings on queries and keys only (it rotates the "
                              "values too)")
    return {
        "num_text_tokens": config.num_text_tokens, "text_seq_len": config.text_seq_len,
        "dim": config.dim, "depth": config.depth, "heads": config.heads,
        "dim_head": config.dim_head, "reversible": False,
        "loss_img_weight": config.loss_img_weight, "attn_types": tuple(config.attn_types),
        "ff_dropout": config.ff_dropout, "attn_dropout": config.attn_dropout,
        "stable": config.stable_softmax, "shift_tokens": config.shift_tokens,
        "rotary_emb": config.rotary_emb,
        "shared_attn_ids": tuple(config.shared_attn_ids) if config.shared_attn_ids else None,
        "shared_ff_ids": tuple(config.shared_ff_ids) if config.shared_ff_ids else None,
        "share_input_output_emb": config.share_input_output_emb,
    }


def their_weights(config: DALLEConfig, weights: dict[str, torch.Tensor]
                  ) -> dict[str, torch.Tensor]:
    """Their DALLE state dict (without the VAE) from ours, in their registration order,
    with every key their strict load_state_dict wants: a shared module under each layer,
    the tied embeddings' path to the projection, the rotary buffer, and LayerScale vectors
    of ones where our model has none (x * 1 is x, exactly)."""
    def ours(name: str) -> torch.Tensor:
        return weights[name].detach().to(torch.float32).contiguous()

    dim, fn = config.dim, "fn."
    out: dict[str, torch.Tensor] = {}
    if not config.rotary_emb:
        out["text_pos_emb.weight"] = ours("text_pos_emb.weight")
        f = config.image_fmap_size
        out["image_pos_emb.weights.0"] = ours("image_row_emb.weight").reshape(1, f, 1, dim)
        out["image_pos_emb.weights.1"] = ours("image_col_emb.weight").reshape(1, 1, f, dim)
    attn_path = fn * (5 if config.shift_tokens else 3)
    ff_path = fn * (4 if config.shift_tokens else 2)
    for i in range(config.depth):
        ours_at, theirs_at = f"transformer.blocks.{i}.", f"transformer.layers.layers.{i}."
        for branch, norm, scale in (("0", "attn_norm", "attn_scale"), ("1", "ff_norm", "ff_scale")):
            key = f"{ours_at}{scale}.scale"
            out[f"{theirs_at}{branch}.scale"] = (
                ours(key).reshape(1, 1, dim) if config.layer_scale else torch.ones(1, 1, dim))
            for p in ("weight", "bias"):
                out[f"{theirs_at}{branch}.fn.norm.{p}"] = ours(f"{ours_at}{norm}.{p}")
            if branch == "0":
                out[f"{theirs_at}0.{attn_path}to_qkv.weight"] = ours(f"{ours_at}attn.to_qkv.weight")
                for p in ("weight", "bias"):
                    out[f"{theirs_at}0.{attn_path}to_out.0.{p}"] = ours(f"{ours_at}attn.to_out.{p}")
            else:
                for p in ("weight", "bias"):
                    out[f"{theirs_at}1.{ff_path}net.0.{p}"] = torch.cat(
                        (ours(f"{ours_at}ff.to_value.{p}"), ours(f"{ours_at}ff.to_gate.{p}")))
                for p in ("weight", "bias"):
                    out[f"{theirs_at}1.{ff_path}net.3.{p}"] = ours(f"{ours_at}ff.proj_out.{p}")
    if config.rotary_emb:
        out["transformer.pos_emb"] = rotary_table(config)[None]
    for part, name in (("to_logits.0", "transformer.norm"), ("to_logits.1", "to_logits")):
        for p in ("weight", "bias"):  # their order: the norm's weight and bias first
            out[f"{part}.{p}"] = ours(f"{name}.{p}")
    if config.share_input_output_emb:
        for emb in ("text_emb", "image_emb"):
            for p in ("weight", "bias"):
                out[f"{emb}.linear.{p}"] = out[f"to_logits.1.{p}"]
    else:
        out["text_emb.weight"] = ours("text_emb.weight")
        out["image_emb.weight"] = ours("image_emb.weight")
    return out


def export_dalle_pytorch(payload: dict[str, Any]) -> dict[str, Any]:
    """The dict DALLE-pytorch's generate.py loads (train_dalle.py's save_model keys) for a
    DALL-E payload of ours; the weights only (no optimizer: its Adam numbers parameters in
    its own order, and a run goes on here)."""
    if payload["kind"] != "dalle":
        raise CheckpointError("PATH: a VAE exports to DALLE-pytorch inside the DALL-E "
                              "trained on it", "export the DALL-E checkpoint")
    configs = payload["configs"]
    from dalle_dist.model.image_tokenizer import is_vqgan_config

    if is_vqgan_config(configs["vae"]):
        raise _export_refusal("a DALL-E on a taming VQGAN (its VQGanVAE loads the VQGAN from "
                              "its own files)")
    config = DALLEConfig.from_dict(configs["model"])
    vae_config = VAEConfig.from_dict(configs["vae"])
    hparams, vae_params = their_hparams(config), their_vae_params(vae_config)
    weights = their_weights(config, payload["weights"])
    vae = payload["vae_weights"]
    for theirs, ours_key in their_vae_keys(vae_config):
        weights["vae." + theirs] = vae[ours_key].detach().to(torch.float32).contiguous()
    return {"hparams": hparams, "vae_params": vae_params,
            "epoch": int(payload.get("epoch") or 0),
            "version": REFERENCE_VERSION, "vae_class_name": "DiscreteVAE",
            "weights": weights, "opt_state": None, "scheduler_state": None}


def export_vae_dalle_pytorch(payload: dict[str, Any]) -> dict[str, Any]:
    """train_vae.py's {hparams, weights} for a VAE payload of ours."""
    config = VAEConfig.from_dict(payload["configs"]["model"])
    vae = payload["weights"]
    return {"hparams": their_vae_params(config),
            "weights": {theirs: vae[ours].detach().to(torch.float32).contiguous()
                        for theirs, ours in their_vae_keys(config)}}


def write_export(path: str | Path, out: str | Path, force: bool = False,
                 weights: str = "auto") -> dict[str, Any]:
    """`checkpoint export PATH OUT --format dalle-pytorch`: OUT is a .pt file that
    DALLE-pytorch's generate.py (a DALL-E) or train_dalle.py --vae_path (a VAE) loads.
    weights: auto, ema or trained (checkpoint.tools.choose_weights)."""
    from dalle_dist.checkpoint.load import read_any_checkpoint
    from dalle_dist.checkpoint.tools import check_output, choose_weights, verify_payload

    out = Path(out)
    check_output(out, "OUT", force)
    payload = read_any_checkpoint(path, "PATH", with_optimizer=False)
    verify_payload(payload, "PATH", Path(path))
    payload, _ = choose_weights(payload, weights, f"PATH {path}")
    if payload["kind"] == "vae":
        obj = export_vae_dalle_pytorch(payload)
    else:
        obj = export_dalle_pytorch(payload)
        tokenizer = payload["configs"].get("tokenizer")
        if tokenizer is not None:
            obj[TOKENIZER_KEY] = tokenizer
    write_checkpoint_file(out, obj)
    return obj
