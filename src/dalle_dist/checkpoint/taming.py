"""Reading a taming-transformers VQGAN: its Lightning checkpoint and its YAML, safely.

A taming `last.ckpt` is a pytorch-lightning checkpoint: {epoch, global_step,
pytorch-lightning_version, callbacks, optimizer_states, lr_schedulers, state_dict}. Saved
by Lightning 1.x (taming trained with 1.0.8), `callbacks` is keyed by the callback's
*class*, so the pickle names `pytorch_lightning.callbacks.model_checkpoint.ModelCheckpoint`,
the global that makes torch.load(weights_only=True) refuse such files (reported for the
CompVis LDSR checkpoint of the same lineage, flowtyone/ComfyUI-Flowty-LDSR#8). We read it
with weights_only=True and an allow-list that maps exactly that name to an inert marker
class (nothing of Lightning is imported or run), plus numpy's scalar and dtype, which
Lightning 1.x checkpoints of CompVis models hold in their callback state (scores logged
as numpy values; ComfyUI#10333, AUTOMATIC1111's safe unpickler allows the same three).
Any other global refuses the file in one line. The YAML is read with yaml.safe_load.

Only `state_dict` is used: its `loss.*` entries (perceptual loss, discriminator) are not
part of the tokenizer and are dropped; everything else must match the config exactly.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from dalle_dist.checkpoint.format import load_weights_only
from dalle_dist.config_base import option
from dalle_dist.errors import CheckpointError, ConfigError
from dalle_dist.model.vqgan import VQGAN, VQGANConfig

VQMODEL_TARGET = "taming.models.vqgan.VQModel"
DDCONFIG_KEYS = ("ch", "ch_mult", "num_res_blocks", "attn_resolutions", "resolution",
                 "z_channels", "in_channels", "out_ch", "double_z", "dropout")
#: Decoder options that change its output; a VQGAN config leaves them off
UNSUPPORTED_DDCONFIG = ("give_pre_end", "tanh_out")


@dataclass(frozen=True)
class TamingConfig:
    """DALLE-pytorch's VQGAN flags (train_dalle.py, generate.py), same names."""

    taming: bool = option(
        False, "use a taming-transformers VQGAN as the image tokenizer instead of a VAE "
        "(DALLE-pytorch's switch); needs --vqgan_model_path and --vqgan_config_path, "
        "which alone select it too: dalle-dist downloads no pretrained weights")
    vqgan_model_path: str | None = option(
        None, "taming VQGAN checkpoint (its Lightning .ckpt, e.g. last.ckpt), read "
        "without unpickling code", metavar="PATH", default_text="default: none")
    vqgan_config_path: str | None = option(
        None, "the VQGAN's YAML (model.yaml: model.params embed_dim, n_embed, ddconfig)",
        metavar="PATH", default_text="default: none")

    @property
    def wanted(self) -> bool:
        """Whether the flags ask for a VQGAN (checked by `validate` first)."""
        return self.taming or bool(self.vqgan_model_path or self.vqgan_config_path)

    def validate(self, fix: str | None = None) -> None:
        """Both paths or none; --taming alone cannot work (nothing to download from).
        fix: what to do about --taming alone, where a command knows better (generate)."""
        model, config = self.vqgan_model_path, self.vqgan_config_path
        if self.taming and not (model or config):
            raise ConfigError(
                "--taming needs --vqgan_model_path and --vqgan_config_path: dalle-dist "
                "does not download pretrained VQGAN weights (DALLE-pytorch fetched "
                "vqgan_imagenet_f16_16384)",
                fix or "download a taming VQGAN's last.ckpt and model.yaml, then give "
                "--vqgan_model_path last.ckpt --vqgan_config_path model.yaml")
        if bool(model) != bool(config):
            given, missing = (("--vqgan_model_path", "--vqgan_config_path") if model else
                              ("--vqgan_config_path", "--vqgan_model_path"))
            raise ConfigError(f"{given} needs {missing} too",
                              "give the VQGAN's checkpoint and its YAML config together")


#: --taming alone where a DALL-E checkpoint is read: it already carries its VQGAN
GENERATE_FIX = ("a DALL-E checkpoint carries its VQGAN: drop --taming, or give both paths "
                "to have them checked against it")


class LightningCallbackKey:
    """Stands in for Lightning 1.x's ModelCheckpoint class where a checkpoint uses it as
    the key of its callback state: a name, never instantiated, nothing of Lightning run."""


def _allowed_globals() -> list[Any]:
    allowed: list[Any] = [
        (LightningCallbackKey, "pytorch_lightning.callbacks.model_checkpoint.ModelCheckpoint"),
    ]
    try:
        import numpy as np
    except ImportError:  # a file that holds numpy values is then refused, in one line
        return allowed
    try:
        from numpy._core.multiarray import scalar  # numpy >= 2
    except ImportError:
        from numpy.core.multiarray import scalar  # type: ignore[no-redef]

    # Pickled by numpy 1 under its old module name, by numpy 2 under the new one.
    allowed += [(scalar, "numpy.core.multiarray.scalar"),
                (scalar, "numpy._core.multiarray.scalar"), np.dtype]
    # Unpickling a dtype sets state on an instance of its class (numpy >= 1.25: one class
    # per dtype), which torch allows only by name: the numeric kinds a score can have.
    allowed += [type(np.dtype(kind)) for kind in (np.float16, np.float32, np.float64,
                                                   np.int32, np.int64, np.bool_)]
    return allowed


@contextmanager
def _lightning_globals() -> Iterator[None]:
    import warnings

    with warnings.catch_warnings():  # numpy 2 warns on the numpy.core import
        warnings.simplefilter("ignore", DeprecationWarning)
        allowed = _allowed_globals()
    with torch.serialization.safe_globals(allowed):
        yield


def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _existing_file(path: str | Path, flag: str, what: str) -> Path:
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{flag} {path} does not exist", f"give the path of {what}")
    if path.is_dir():
        raise CheckpointError(f"{flag} {path} is a directory", f"give the path of {what}")
    return path


def read_taming_state_dict(path: str | Path, flag: str = "--vqgan_model_path"
                           ) -> dict[str, torch.Tensor]:
    """The VQGAN weights of a taming checkpoint (Lightning .ckpt, or a bare state_dict),
    without the `loss.*` entries; a one-line CheckpointError for anything else."""
    path = _existing_file(path, flag, "the VQGAN's .ckpt")
    with _lightning_globals():
        payload = load_weights_only(
            path, flag, "give the VQGAN's own last.ckpt, or save its state_dict alone with "
            "torch.save", "download it again",
            pickled="pickled Python objects beyond a taming checkpoint's weights and "
            "Lightning state")
    state = payload.get("state_dict", payload) if isinstance(payload, dict) else None
    if not isinstance(state, dict) or not any(
            isinstance(k, str) and k.startswith("encoder.") for k in state):
        raise CheckpointError(f"{flag} {path} holds no VQGAN weights (no state_dict with "
                              "encoder.* entries)",
                              "give a taming-transformers VQGAN checkpoint (last.ckpt)")
    return {k: v for k, v in state.items() if not k.startswith("loss.")}


def read_vqgan_config(path: str | Path, flag: str = "--vqgan_config_path",
                      source_sha256: str = "") -> VQGANConfig:
    """model.params of a taming YAML (safe_load: plain data only) as a checked config."""
    path = _existing_file(path, flag, "the VQGAN's model.yaml")
    try:
        import yaml
    except ImportError:
        raise ConfigError(f"reading {flag} needs PyYAML, which is not installed",
                          "pip install 'dalle_dist[taming]'") from None
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError, OSError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(f"{flag} {path} is not readable YAML ({reason})",
                          "give the VQGAN's model.yaml") from None
    model = document.get("model") if isinstance(document, dict) else None
    params = model.get("params") if isinstance(model, dict) else None
    ddconfig = params.get("ddconfig") if isinstance(params, dict) else None
    if not isinstance(ddconfig, dict):
        raise ConfigError(f"{flag} {path} has no model.params.ddconfig",
                          "give a taming-transformers VQGAN config (model.yaml)")
    target = model.get("target", VQMODEL_TARGET)
    if target != VQMODEL_TARGET:
        raise ConfigError(f"{flag} {path} describes {target}; only {VQMODEL_TARGET} is "
                          "supported (not the Gumbel or EMA quantizers)",
                          "use a VQModel checkpoint such as vqgan_imagenet_f16_16384")
    if params.get("remap") is not None:
        raise ConfigError(f"{flag} {path} remaps codebook indices (model.params.remap), "
                          "which dalle-dist does not support", "use a VQGAN without remap")
    on = [key for key in UNSUPPORTED_DDCONFIG if ddconfig.get(key)]
    if on:
        raise ConfigError(f"{flag} {path} sets ddconfig {', '.join(on)}, which changes "
                          "the decoder's output; dalle-dist does not support it",
                          "use a VQGAN config without it")
    missing = [key for key in ("embed_dim", "n_embed") if key not in params] + [
        key for key in DDCONFIG_KEYS if key not in ddconfig
        and key not in ("in_channels", "out_ch", "double_z", "dropout")]
    if missing:
        raise ConfigError(f"{flag} {path} lacks {', '.join(missing)} in model.params",
                          "give the VQGAN's complete model.yaml")
    try:
        config = VQGANConfig(embed_dim=params["embed_dim"], n_embed=params["n_embed"],
                             source_sha256=source_sha256,
                             **{k: ddconfig[k] for k in DDCONFIG_KEYS if k in ddconfig})
    except TypeError as exc:  # a list where a number belongs, and the like
        raise ConfigError(f"{flag} {path} has a malformed ddconfig ({exc})",
                          "give the VQGAN's model.yaml") from None
    config.validate(f"{flag} {path}")
    return config


def load_vqgan(model_path: str | Path, config_path: str | Path) -> VQGAN:
    """The frozen VQGAN a taming checkpoint + YAML describe, weights loaded and checked."""
    config = read_vqgan_config(config_path, source_sha256=file_sha256(
        _existing_file(model_path, "--vqgan_model_path", "the VQGAN's .ckpt")))
    state = read_taming_state_dict(model_path)
    vqgan = VQGAN(config)
    expected = vqgan.state_dict()
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    wrong = [k for k in expected if k in state and state[k].shape != expected[k].shape]
    if missing or unexpected or wrong:
        what = (f"lacks {missing[0]}" if missing else f"has {unexpected[0]}, which the config "
                "does not build" if unexpected else
                f"has {wrong[0]} of shape {list(state[wrong[0]].shape)}, the config "
                f"{list(expected[wrong[0]].shape)}")
        extra = len(missing) + len(unexpected) + len(wrong) - 1
        raise CheckpointError(
            f"--vqgan_model_path {model_path} does not match --vqgan_config_path "
            f"{config_path}: it {what}" + (f" (and {extra} more)" if extra else ""),
            "give the model.yaml that came with this checkpoint")
    vqgan.load_state_dict(state)
    return vqgan.eval().requires_grad_(False)


def check_carried_vqgan(carried: dict[str, Any], flags: TamingConfig, flag: str,
                        path: str | Path) -> None:
    """A DALL-E checkpoint carries its image tokenizer; VQGAN flags given beside it must
    name that very VQGAN (same file, by sha256; same config), or they are refused.

    carried: the checkpoint's configs["vae"]; flag/path: the checkpoint's flag and path."""
    from dalle_dist.model.image_tokenizer import is_vqgan_config

    if not flags.wanted:
        return
    flags.validate(GENERATE_FIX)
    if not is_vqgan_config(carried):
        raise ConfigError(f"{flag} {path} was trained on a dalle-dist VAE, not a VQGAN",
                          "drop --taming and the --vqgan_* flags: the checkpoint carries "
                          "its VAE")
    ours = VQGANConfig.from_dict(carried)
    config = read_vqgan_config(flags.vqgan_config_path, source_sha256=ours.source_sha256)
    if config != ours:
        raise ConfigError(f"--vqgan_config_path {flags.vqgan_config_path} describes another "
                          f"VQGAN than the one {flag} {path} was trained with",
                          "drop the --vqgan_* flags: the checkpoint carries its VQGAN")
    given = file_sha256(_existing_file(flags.vqgan_model_path, "--vqgan_model_path",
                                       "the VQGAN's .ckpt"))
    if given != ours.source_sha256:
        raise ConfigError(f"--vqgan_model_path {flags.vqgan_model_path} (sha256 "
                          f"{given[:12]}) is not the VQGAN {flag} {path} was trained with "
                          f"(sha256 {ours.source_sha256[:12]})",
                          "drop the --vqgan_* flags: the checkpoint carries its VQGAN")
