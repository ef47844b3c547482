"""DALLE-pytorch 1.x files -> our checkpoints (`checkpoint import`;
docs/from-dalle-pytorch.md; the other way: checkpoint/dalle_pytorch_export.py).

DALLE-pytorch's train_dalle.py saves `dalle.pt` as {hparams, vae_params, epoch, version,
vae_class_name, weights, opt_state, scheduler_state}, and train_vae.py saves `vae.pt` as
{hparams, weights}. Both are read with torch.load(weights_only=True) and nothing of
DALLE-pytorch is imported: its keyword arguments become our configs, its state dict our
parameter names, by the rules below. Where its model differs from ours, ours has the
difference as a config field the import sets (DALLEConfig.layer_scale, rotate_values,
VAEConfig.decoder_stem); what ours cannot compute (reversible layers, sandwich norm,
OpenAI's dVAE) is refused in one line naming it, before anything is written.

Weights, theirs -> ours (layer i; the wrappers between a layer and its module vary with
shift_tokens and the attention type, so the module is found by its own key's end):
  text_emb / image_emb / text_pos_emb        the same names
  image_pos_emb.weights.0 / .1               image_row_emb / image_col_emb
                                              (axial_positional_embedding < 0.3: weights_0/_1)
  transformer.layers.layers.i.0.scale        blocks.i.attn_scale.scale   (LayerScale)
  ....i.0.fn.norm                            blocks.i.attn_norm
  ....i.0.fn.(...).to_qkv / to_out.0         blocks.i.attn.to_qkv / to_out
  ....i.1.scale / .1.fn.norm                 blocks.i.ff_scale.scale / ff_norm
  ....i.1.fn.(...).net.0                     blocks.i.ff.to_value (first half of the rows),
                                              ff.to_gate (second half): GEGLU's chunk(2)
  ....i.1.fn.(...).net.3                     blocks.i.ff.proj_out
  to_logits.0 / to_logits.1                  transformer.norm / to_logits
  transformer.pos_emb                        nothing: the rotary angles, checked against ours
The optimizer's state follows the same map, by position in DALLE-pytorch's parameter order
(its state dict's order less buffers, the VAE and a shared module's repeats).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch

from dalle_dist.checkpoint.dalle_pytorch_layout import (
    REFERENCE_VERSION,
    TOKENIZER_KEY,
    rotary_table,
    their_vae_keys,
)
from dalle_dist.checkpoint.format import (
    LoopState,
    checkpoint_meta,
    load_weights_only,
    write_checkpoint_file,
)
from dalle_dist.errors import CheckpointError, ConfigError
from dalle_dist.model.config import DALLEConfig, VAEConfig

#: DALLE(...)'s defaults in 1.6.6, for a key a file's hparams lack (its generate.py builds
#: DALLE(vae=vae, **hparams), so those defaults are what the file meant)
DALLE_DEFAULTS: dict[str, Any] = {
    "num_text_tokens": 10000, "text_seq_len": 256, "heads": 8, "dim_head": 64,
    "reversible": False, "attn_dropout": 0.0, "ff_dropout": 0.0, "sparse_attn": False,
    "attn_types": None, "loss_img_weight": 7, "stable": False, "sandwich_norm": False,
    "shift_tokens": True, "rotary_emb": True, "shared_attn_ids": None,
    "shared_ff_ids": None, "share_input_output_emb": False,
    "optimize_for_inference": False,
}
#: DiscreteVAE(...)'s defaults in 1.6.6
VAE_DEFAULTS: dict[str, Any] = {
    "image_size": 256, "num_tokens": 512, "codebook_dim": 512, "num_layers": 3,
    "num_resnet_blocks": 0, "hidden_dim": 64, "channels": 3, "smooth_l1_loss": False,
    "temperature": 0.9, "straight_through": False, "reinmax": False,
    "kl_div_loss_weight": 0.0,
    "normalization": ((0.5, 0.5, 0.5, 0), (0.5, 0.5, 0.5, 1)),
}
#: the only normalisation our VAE computes: x * 2 - 1 per channel
PLAIN_NORMALIZATION = ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))


@dataclass
class Imported:
    """What `import_file` made of a file: our payload and what the user should know."""

    payload: dict[str, Any]
    notes: list[str]


def _refuse(path: Path, what: str, fix: str | None = None) -> CheckpointError:
    return CheckpointError(f"SRC {path}: {what}", fix)


# -- configs ----------------------------------------------------------------------------


def _vae_config(vae_params: dict[str, Any], path: Path) -> VAEConfig:
    """Our VAEConfig for DiscreteVAE(**vae_params), or a refusal naming the option."""
    unknown = sorted(set(vae_params) - set(VAE_DEFAULTS))
    if unknown:
        raise _refuse(path, f"its VAE has option {unknown[0]}, which DALLE-pytorch "
                      f"{REFERENCE_VERSION} does not have and dalle_dist cannot import")
    p = {**VAE_DEFAULTS, **vae_params}
    channels = int(p["channels"])
    means, stds = (tuple(float(v) for v in t[:channels]) for t in p["normalization"])
    if means != PLAIN_NORMALIZATION[0][:channels] or stds != PLAIN_NORMALIZATION[1][:channels]:
        raise _refuse(path, f"its VAE normalises images with means {means} and stds {stds}; "
                      "dalle_dist's VAE computes only (x - 0.5) / 0.5")
    if p["reinmax"]:
        raise _refuse(path, "its VAE was trained with reinmax=True, which dalle_dist's VAE "
                      "training does not have")
    return VAEConfig(
        image_size=int(p["image_size"]), num_tokens=int(p["num_tokens"]),
        codebook_dim=int(p["codebook_dim"]), num_layers=int(p["num_layers"]),
        num_resnet_blocks=int(p["num_resnet_blocks"]), hidden_dim=int(p["hidden_dim"]),
        channels=channels, smooth_l1_loss=bool(p["smooth_l1_loss"]),
        kl_loss_weight=float(p["kl_div_loss_weight"]),
        straight_through=bool(p["straight_through"]),
        decoder_stem=int(p["num_resnet_blocks"]) > 0)


def _per_layer(ids: Any, depth: int) -> tuple[str, ...] | None:
    """DALLE-pytorch cycles a shorter id list over the layers; ours takes one id per layer
    (None: no two layers share)."""
    if ids is None:
        return None
    ids = [ids] if isinstance(ids, (str, int)) else list(ids)
    if not ids:
        return None
    full = tuple(str(ids[i % len(ids)]) for i in range(depth))
    return full if len(set(full)) < depth else None


def _attn_types(value: Any) -> tuple[str, ...]:
    if value is None:
        return ("full",)
    if isinstance(value, str):
        return tuple(t.strip() for t in value.split(",") if t.strip())
    return tuple(str(t) for t in value)


def dalle_config(hparams: dict[str, Any], vae: Any, path: Path) -> DALLEConfig:
    """Our DALLEConfig for DALLE(vae=vae, **hparams), or a refusal naming the option
    (`vae`: the image tokenizer's config, a VAEConfig or VQGANConfig)."""
    unknown = sorted(set(hparams) - set(DALLE_DEFAULTS) - {"dim", "depth"})
    if unknown:
        raise _refuse(path, f"its hparams have option {unknown[0]}, which DALLE-pytorch "
                      f"{REFERENCE_VERSION} does not have and dalle_dist cannot import")
    for key in ("dim", "depth"):
        if key not in hparams:
            raise _refuse(path, f"its hparams lack {key}, which DALLE-pytorch needs")
    p = {**DALLE_DEFAULTS, **hparams}
    if p["reversible"]:
        raise _refuse(path, "reversible=True: DALLE-pytorch's reversible layers run two "
                      "residual streams, a different function from dalle_dist's layers "
                      "(whose --reversible means activation checkpointing)",
                      "it cannot be imported; a model trained without --reversible can")
    if p["sandwich_norm"]:
        raise _refuse(path, "sandwich_norm=True: dalle_dist's layers have no norm after "
                      "each branch")
    depth = int(p["depth"])
    attn_types = _attn_types(p["attn_types"])
    config = DALLEConfig(
        num_text_tokens=int(p["num_text_tokens"]), text_seq_len=int(p["text_seq_len"]),
        num_image_tokens=vae.num_tokens, image_fmap_size=vae.fmap_size,
        dim=int(p["dim"]), depth=depth, heads=int(p["heads"]), dim_head=int(p["dim_head"]),
        ff_mult=4, attn_dropout=float(p["attn_dropout"]), ff_dropout=float(p["ff_dropout"]),
        attn_types=attn_types, loss_img_weight=float(p["loss_img_weight"]),
        stable_softmax=bool(p["stable"]), rotary_emb=bool(p["rotary_emb"]),
        shift_tokens=bool(p["shift_tokens"]),
        shared_attn_ids=_per_layer(p["shared_attn_ids"], depth),
        shared_ff_ids=_per_layer(p["shared_ff_ids"], depth),
        share_input_output_emb=bool(p["share_input_output_emb"]),
        layer_scale=True, rotate_values=bool(p["rotary_emb"]))
    try:
        config.validate()
    except ConfigError as exc:
        raise _refuse(path, f"its hparams describe no model dalle_dist can build ({exc})"
                      ) from None
    return config


# -- weights ----------------------------------------------------------------------------

_LAYER = re.compile(r"^transformer\.layers\.layers\.(\d+)\.([01])\.(.*)$")
#: a branch's parameters, by the end of their key: (ours, which half of its rows or None)
_ATTN_PARTS = {"to_qkv.weight": ("attn.to_qkv.weight", None),
               "to_out.0.weight": ("attn.to_out.weight", None),
               "to_out.0.bias": ("attn.to_out.bias", None)}
_FF_PARTS = {"net.0.weight": ("ff.to_value.weight", 0), "net.0.bias": ("ff.to_value.bias", 0),
             "net.3.weight": ("ff.proj_out.weight", None),
             "net.3.bias": ("ff.proj_out.bias", None)}
_TOP = {"text_emb.weight": "text_emb.weight", "image_emb.weight": "image_emb.weight",
        "text_pos_emb.weight": "text_pos_emb.weight",
        "image_pos_emb.weights.0": "image_row_emb.weight",
        "image_pos_emb.weights_0": "image_row_emb.weight",
        "image_pos_emb.weights.1": "image_col_emb.weight",
        "image_pos_emb.weights_1": "image_col_emb.weight",
        "to_logits.0.weight": "transformer.norm.weight",
        "to_logits.0.bias": "transformer.norm.bias",
        "to_logits.1.weight": "to_logits.weight", "to_logits.1.bias": "to_logits.bias"}
#: keys of DALLE-pytorch's state dict that are no parameter of their own: the rotary
#: angles buffer, and with share_input_output_emb the tied embeddings' path to
#: to_logits.1 (its SharedEmbedding registers the projection as a submodule)
_BUFFERS = ("transformer.pos_emb", "text_emb.linear.weight", "text_emb.linear.bias",
            "image_emb.linear.weight", "image_emb.linear.bias")


def _ours(key: str) -> list[tuple[str, int | None]] | None:
    """Our parameter(s) for one of their DALLE state dict keys: (name, None) for the whole
    tensor, or one entry per half of its rows (GEGLU's value and gate); None: not a key
    we know."""
    if key in _TOP:
        return [(_TOP[key], None)]
    match = _LAYER.match(key)
    if match is None:
        return None
    layer, branch, rest = int(match[1]), match[2], match[3]
    prefix = f"transformer.blocks.{layer}."
    if rest == "scale":
        return [(prefix + ("attn_scale.scale" if branch == "0" else "ff_scale.scale"), None)]
    if rest in ("fn.norm.weight", "fn.norm.bias"):
        return [(prefix + ("attn_norm." if branch == "0" else "ff_norm.") + rest[8:], None)]
    parts = _ATTN_PARTS if branch == "0" else _FF_PARTS
    for end, (name, half) in parts.items():
        if rest.endswith("." + end):
            if half is None:
                return [(prefix + name, None)]
            gate = name.replace("to_value", "to_gate")
            return [(prefix + name, 0), (prefix + gate, 1)]
    return None


def _piece(tensor: torch.Tensor, half: int | None, target: torch.Size) -> torch.Tensor:
    """Their tensor (or one half of its rows) in our parameter's shape."""
    if half is not None:
        tensor = tensor.chunk(2, dim=0)[half]
    return tensor.reshape(target)


def _shared_later(config: DALLEConfig, attention: bool, layer: int) -> bool:
    """Whether `layer`'s attention (or feed-forward) module is an earlier layer's
    (--shared_*_ids): a state dict names it again there, named_parameters (and so an
    optimizer) does not."""
    ids = config.shared_attn_ids if attention else config.shared_ff_ids
    return ids is not None and ids[layer] in ids[:layer]


def _shared_repeat(key: str, config: DALLEConfig) -> bool:
    """_shared_later for one of their keys (a layer's scale and norm are its own)."""
    match = _LAYER.match(key)
    if match is None or match[3] == "scale" or match[3].startswith("fn.norm."):
        return False
    return _shared_later(config, match[2] == "0", int(match[1]))


def their_parameter_order(weights: dict[str, torch.Tensor], config: DALLEConfig) -> list[str]:
    """DALLE-pytorch's trainable parameters in its named_parameters() order, the order its
    Adam numbers them: its state dict's keys (registration order) less the VAE, buffers
    and a shared module's repeats."""
    return [k for k in weights if not k.startswith("vae.") and k not in _BUFFERS
            and not _shared_repeat(k, config)]


def map_weights(weights: dict[str, torch.Tensor], model: torch.nn.Module, path: Path
                ) -> dict[str, torch.Tensor]:
    """Our state dict (every name of `model`'s) from their DALLE weights, or a refusal
    naming the first key that fits nowhere or the first parameter nothing fills."""
    ours = model.state_dict()
    out: dict[str, torch.Tensor] = {}
    for key, tensor in weights.items():
        if key.startswith("vae.") or key in _BUFFERS:
            continue
        targets = _ours(key)
        if targets is None:
            raise _refuse(path, f"weight {key} belongs to no part of the model dalle_dist "
                          "builds from its hparams")
        for name, half in targets:
            if name.endswith("_scale.scale") and name not in ours:
                continue  # scales all of one (scales_are_ones): the model has none
            if name not in ours:
                raise _refuse(path, f"weight {key} has no counterpart ({name}) in the model "
                              "its hparams describe")
            value = tensor.detach().to(torch.float32)
            rows = value.shape[0] if value.dim() else 0
            if half is not None and rows % 2:
                raise _refuse(path, f"weight {key} has {rows} rows, not value + gate")
            if value.numel() != ours[name].numel() * (2 if half is not None else 1):
                raise _refuse(path, f"weight {key} has shape {tuple(tensor.shape)}, which "
                              f"does not fit {name} {tuple(ours[name].shape)}")
            piece = _piece(value, half, ours[name].shape)
            out[name] = piece.clone()
    missing = [name for name in ours if name not in out]
    if missing:
        raise _refuse(path, f"nothing in the file fills {missing[0]}",
                      "the file's weights do not match its own hparams")
    return out


def scales_are_ones(weights: dict[str, torch.Tensor]) -> bool:
    """Whether every LayerScale vector is exactly one, as in an export of a model of ours
    without them: x * 1 is x, so the import leaves them out and gives the same weights
    back (a DALLE-pytorch run starts them at 0.1 and trains them)."""
    scales = [t for k, t in weights.items() if _LAYER.match(k) and k.endswith(".scale")]
    return bool(scales) and all(bool(torch.all(t == 1)) for t in scales)


def check_rotary(weights: dict[str, torch.Tensor], config: DALLEConfig, path: Path) -> None:
    """The rotary angles the file was trained with (its transformer.pos_emb buffer) must be
    ours: rotary-embedding-torch changed its formulas between releases."""
    saved = weights.get("transformer.pos_emb")
    if saved is None or not config.rotary_emb:
        return
    ours = rotary_table(config).to(torch.float64)
    saved = saved.detach().to(torch.float64).reshape(-1, saved.shape[-1])[: ours.shape[0]]
    if saved.shape != ours.shape:
        raise _refuse(path, f"its rotary table has shape {tuple(saved.shape)}, dalle_dist's "
                      f"has {tuple(ours.shape)} for these hparams")
    # fp32 products of angles up to 8192 rad round by ~1e-3 rad; a changed formula moves
    # them by far more
    worst = (saved - ours).abs().max().item()
    if worst > 1e-2:
        raise _refuse(path, f"its rotary angles differ from dalle_dist's by up to {worst:.3g} "
                      "rad: it was trained with a rotary-embedding-torch release whose "
                      "formulas dalle_dist does not compute",
                      "dalle_dist follows rotary-embedding-torch 0.9")


def map_optimizer(opt_state: dict[str, Any] | None, weights: dict[str, torch.Tensor],
                  config: DALLEConfig, ours: dict[str, torch.Tensor]
                  ) -> tuple[dict[str, Any] | None, str | None]:
    """Their Adam state_dict in our form (state by parameter name); or (None, why not)."""
    if not opt_state:
        return None, "the file holds no optimizer state"
    if not isinstance(opt_state, dict) or len(opt_state.get("param_groups", [])) != 1:
        return None, "its optimizer state is not one Adam parameter group"
    order = their_parameter_order(weights, config)
    group = dict(opt_state["param_groups"][0])
    indices = list(group.pop("params"))
    if len(indices) != len(order):
        return None, (f"its optimizer has {len(indices)} parameters where the model has "
                      f"{len(order)} trainable ones")
    state: dict[str, Any] = {}
    names: list[str] = []
    for index, key in zip(indices, order, strict=True):
        targets = [(n, h) for n, h in _ours(key) or [] if n in ours]
        names += [name for name, _ in targets]
        saved = opt_state["state"].get(index)
        if not saved:
            continue
        for name, half in targets:
            # every tensor its own copy: value and gate sharing one `step` tensor would
            # count each step twice
            state[name] = {
                field: (_piece(value.to(torch.float32), half, ours[name].shape).clone()
                        if torch.is_tensor(value) and value.dim() else
                        value.clone() if torch.is_tensor(value) else value)
                for field, value in saved.items()}
    owned = [n for n in ours if not _is_repeat_of_ours(n, config)]  # named_parameters order
    if sorted(names) != sorted(owned):
        return None, "its optimizer's parameters do not cover the model's"
    group["params"] = owned  # load_state_dict pairs a group's parameters by position
    return {"state": state, "param_groups": [group]}, None


def _is_repeat_of_ours(name: str, config: DALLEConfig) -> bool:
    """_shared_later for one of our parameter names."""
    match = re.match(r"^transformer\.blocks\.(\d+)\.(attn|ff)\.", name)
    return match is not None and _shared_later(config, match[2] == "attn", int(match[1]))


# -- reading ----------------------------------------------------------------------------


def read_file(path: Path) -> dict[str, Any]:
    """The file's dict, read without running code, or a one-line refusal."""
    if not path.exists():
        raise CheckpointError(f"SRC {path} does not exist", "check the path")
    if path.is_dir():
        raise _refuse(path, "is a directory; DALLE-pytorch's DeepSpeed checkpoints "
                      "(NAME-ds-cp/) import once consolidated",
                      "run DeepSpeed's zero_to_fp32.py on it and give the .pt it writes, "
                      "or give the dalle.pt train_dalle.py wrote without DeepSpeed")
    obj = load_weights_only(
        path, "SRC", "re-save it as DALLE-pytorch's scripts save: a dict of its hparams "
        "and state_dict tensors", "give another copy", pickled="pickled Python objects")
    if not isinstance(obj, dict) or "hparams" not in obj or "weights" not in obj:
        raise _refuse(path, "is not a DALLE-pytorch dalle.pt or vae.pt (no 'hparams' and "
                      "'weights')", "a dalle_dist checkpoint needs no import")
    if isinstance(obj["weights"], str):
        raise _refuse(path, "is the auxiliary file of a DALLE-pytorch DeepSpeed checkpoint "
                      "(it holds no weights)",
                      "consolidate the DeepSpeed directory with zero_to_fp32.py first")
    return obj


def _payload(kind: str, configs: dict[str, Any], weights: dict[str, torch.Tensor],
             epoch: int, **rest: Any) -> dict[str, Any]:
    """A single-file payload as `train` writes one, at the start of `epoch`, with no
    random states (the run seeds from --seed)."""
    meta = checkpoint_meta(kind, configs, asdict(LoopState(epoch=epoch)), [], "dalle-pytorch",
                           1, precision="fp32", checkpoint_format="full")
    return {**meta, "weights": weights, "optimizer": None, "scheduler": None,
            "scaler": None, **rest}


def _vae_weights(weights: dict[str, torch.Tensor], config: VAEConfig, path: Path,
                 prefix: str = "") -> dict[str, torch.Tensor]:
    """Our DiscreteVAE state dict from theirs (keys under `prefix`): the same layers,
    named as their_vae_keys pairs them; a missing, extra or misshapen one is refused."""
    from dalle_dist.model.vae import DiscreteVAE

    with torch.device("meta"):
        shapes = {k: v.shape for k, v in DiscreteVAE(config).state_dict().items()}
    pairs = their_vae_keys(config)
    theirs = {k[len(prefix):] for k in weights if k.startswith(prefix)}
    extra = sorted(theirs - {t for t, _ in pairs})
    if extra:
        raise _refuse(path, f"its VAE weight {prefix}{extra[0]} belongs to no part of the VAE "
                      "its vae_params describe")
    out = {}
    for their_key, name in pairs:
        value = weights.get(prefix + their_key)
        if value is None:
            raise _refuse(path, f"its VAE lacks {prefix}{their_key}, which its vae_params "
                          "describe")
        if value.shape != shapes[name]:
            raise _refuse(path, f"its VAE weight {prefix}{their_key} {tuple(value.shape)} "
                          f"does not fit {name} {tuple(shapes[name])}")
        out[name] = value.detach().to(torch.float32).clone()
    return out


def _their_vqgan(weights: dict[str, torch.Tensor], taming: Any, path: Path) -> Any:
    """The taming VQGAN a VQGanVAE-based dalle.pt was trained on: loaded from the flags'
    files (--vqgan_model_path / --vqgan_config_path, as DALLE-pytorch's generate.py
    --taming takes them), and checked against the copy of its weights the file carries
    (`vae.model.*`; the loss's weights there are no part of the tokenizer)."""
    from dalle_dist.checkpoint.taming import load_vqgan

    if taming is None or not (taming.vqgan_model_path and taming.vqgan_config_path):
        raise _refuse(path, "the model was trained on a taming VQGAN (VQGanVAE), whose "
                      "config the file does not carry",
                      "pass the VQGAN it was trained with: --vqgan_model_path last.ckpt "
                      "--vqgan_config_path model.yaml (DALLE-pytorch's default is "
                      "~/.cache/dalle/vqgan.1024.model.ckpt and vqgan.1024.config.yml)")
    vqgan = load_vqgan(taming.vqgan_model_path, taming.vqgan_config_path)
    for name, value in vqgan.state_dict().items():
        carried = weights.get("vae.model." + name)
        if carried is None or carried.shape != value.shape or not torch.equal(
                carried.to(value.dtype), value):
            raise _refuse(path, f"its VQGAN weight vae.model.{name} differs from "
                          f"--vqgan_model_path {taming.vqgan_model_path}'s",
                          "pass the VQGAN the model was trained with")
    return vqgan


def import_file(path: str | Path, tokenizer: Any = None, taming: Any = None) -> Imported:
    """Our payload for a DALLE-pytorch `dalle.pt` or `vae.pt` (`tokenizer`: the command's
    TokenizerConfig, None: no tokenizer flags; `taming`: its TamingConfig, for a model
    trained on a VQGAN)."""
    from dalle_dist.data.config import TokenizerConfig
    from dalle_dist.model.dalle import DALLE

    path = Path(path)
    obj = read_file(path)
    hparams, weights = obj["hparams"], obj["weights"]
    if not isinstance(hparams, dict) or not isinstance(weights, dict):
        raise _refuse(path, "its hparams or weights are not dicts")
    notes: list[str] = []
    version = obj.get("version")
    if "vae_params" not in obj:  # train_vae.py's vae.pt
        config = _vae_config(hparams, path)
        payload = _payload("vae", {"model": config.to_dict()},
                           _vae_weights(weights, config, path), int(obj.get("epoch", 0)))
        return Imported(payload, [f"a DiscreteVAE, {config.fmap_size}x{config.fmap_size} "
                                  f"tokens of {config.num_tokens}"])
    vae_class = obj.get("vae_class_name")
    vae_params = obj["vae_params"]
    if vae_params is None and vae_class == "VQGanVAE":
        vqgan = _their_vqgan(weights, taming, path)
        image_config, image_weights = vqgan.config, vqgan.state_dict()
    elif vae_params is None:
        which = ("OpenAI's pretrained dVAE" if vae_class in ("OpenAIDiscreteVAE", None) else
                 f"a {vae_class}")
        raise _refuse(path, f"the model was trained on {which}, which dalle_dist cannot "
                      "load (it downloads no pretrained weights, and has no OpenAI dVAE)",
                      "import a model trained on a DiscreteVAE from train_vae.py, or on a "
                      "taming VQGAN (pass its --vqgan_model_path and --vqgan_config_path)")
    else:
        image_config = _vae_config(vae_params, path)
        image_weights = None  # read below, once the options are known to import
    config = dalle_config(hparams, image_config, path)
    if scales_are_ones(weights):
        config = replace(config, layer_scale=False)
    tokenizer_dict, note = import_tokenizer(obj, tokenizer or TokenizerConfig(),
                                            config.num_text_tokens, path)
    if note:
        notes.append(note)
    check_rotary(weights, config, path)
    if "sparse" in config.attn_types:
        notes.append("its 'sparse' layers take dalle_dist's sparse pattern: DeepSpeed drew "
                     "their random blocks when the model was built and did not save them, "
                     "so the blocks differ (as they did at each DALLE-pytorch restart)")
    if image_weights is None:
        image_weights = _vae_weights(weights, image_config, path, prefix="vae.")
    with torch.device("meta"):
        model = DALLE(config)
    mapped = map_weights(weights, model, path)
    dalle_weights = {name: mapped[name] for name in model.state_dict()}  # our order
    optimizer, why = map_optimizer(obj.get("opt_state"), weights, config, dalle_weights)
    if why:
        notes.append(f"no optimizer state carried over: {why}")
    scheduler = obj.get("scheduler_state")
    configs = {"model": config.to_dict(), "vae": image_config.to_dict(),
               "tokenizer": tokenizer_dict}
    payload = _payload("dalle", configs, dalle_weights, int(obj.get("epoch", 0)),
                       vae_weights=image_weights, dalle_pytorch_version=version)
    payload["optimizer"] = optimizer
    payload["scheduler"] = scheduler if isinstance(scheduler, dict) else None
    return Imported(payload, notes)


def write_import(path: str | Path, out: str | Path, tokenizer: Any = None,
                 force: bool = False, taming: Any = None) -> Imported:
    """`checkpoint import SRC OUT`: everything is read and checked before OUT is written
    (atomically)."""
    from dalle_dist.checkpoint.tools import check_output

    check_output(Path(out), "OUT", force)
    imported = import_file(path, tokenizer, taming)
    write_checkpoint_file(out, imported.payload)
    return imported


# -- the tokenizer ----------------------------------------------------------------------

#: DALLE-pytorch's default tokenizer (no --bpe_path): its CLIP BPE, this many ids
CLIP_VOCAB = 49408


def import_tokenizer(obj: dict[str, Any], config: Any, vocab: int, path: Path
                     ) -> tuple[dict[str, Any] | None, str | None]:
    """(tokenizer dict for the checkpoint, a note) from the command's tokenizer flags
    (`config`: a TokenizerConfig), or from what an export of ours kept in the file.

    DALLE-pytorch does not save its tokenizer: without flags the checkpoint carries none,
    and generate and train then ask for the flags (checkpoint.load.dalle_parts)."""
    from dalle_dist.data.config import TokenizerConfig
    from dalle_dist.data.tokenizer import load_tokenizer

    if config.given:
        if config.hug:
            raise _refuse(path, "--hug: DALLE-pytorch feeds a HuggingFace tokenizer's ids to "
                          "its model as they are, dalle_dist shifts them by one to keep 0 for "
                          "padding, so the text embedding rows would not line up",
                          "importing a --hug model is not supported yet")
        tokenizer = load_tokenizer(config)
        if tokenizer.vocab_size != vocab:
            raise _refuse(path, f"the model has {vocab} text tokens, {config.describe()} has "
                          f"{tokenizer.vocab_size}", "give the tokenizer it was trained with")
        return tokenizer.to_dict(), None
    kept = obj.get(TOKENIZER_KEY)
    if isinstance(kept, dict):
        return kept, None
    if vocab == CLIP_VOCAB:
        merges = installed_clip_merges()
        if merges is not None:
            tokenizer = load_tokenizer(TokenizerConfig(bpe_path=str(merges)))
            return tokenizer.to_dict(), (f"{vocab} text tokens: DALLE-pytorch's default CLIP "
                                         f"tokenizer, read from its install ({merges})")
        return None, (f"{vocab} text tokens: DALLE-pytorch's default CLIP tokenizer; the "
                      "checkpoint carries none: pass --bpe_path bpe_simple_vocab_16e6.txt "
                      "(CLIP's merges file, in DALLE-pytorch's package data)")
    return None, ("DALLE-pytorch does not save its tokenizer: the checkpoint carries none; "
                  "pass --bpe_path (a YouTokenToMe model) to `checkpoint import`, or to "
                  "generate and train")


def installed_clip_merges() -> Path | None:
    """CLIP's merges file in an installed DALLE-pytorch's package data, found without
    importing the package; None when there is none."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("dalle_pytorch")
    except (ImportError, ValueError):
        return None
    for folder in (spec.submodule_search_locations or []) if spec else []:
        for name in ("bpe_simple_vocab_16e6.txt", "bpe_simple_vocab_16e6.txt.gz"):
            if (Path(folder) / "data" / name).is_file():
                return Path(folder) / "data" / name
    return None
