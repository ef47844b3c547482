"""DALLE-pytorch 1.6.6 itself, for the import and export tests.

`make test` installs `dalle-pytorch==1.6.6` with `--no-deps`, beside the three modules its
DALLE and DiscreteVAE need (einops, rotary-embedding-torch 0.9.1,
axial_positional_embedding 0.3.12: Makefile). Its package __init__ also imports taming's
VQGAN, omegaconf and pkg_resources, and its tokenizer module transformers' BertTokenizer
(for --chinese), which these tests never use: empty stand-ins take their place when they
are not installed. Its default tokenizer also needs ftfy and regex (installed beside it).
"""

from __future__ import annotations

import sys
import types
from typing import Any

import torch

REFERENCE = "1.6.6"


def dalle_pytorch() -> types.ModuleType:
    """The dalle_pytorch package with its tokenizer module, imported once. The stand-ins
    live in sys.modules only during that import: a pkg_resources stand-in left there
    breaks what asks for the real one later in the same process (pytest's own
    monkeypatch.syspath_prepend)."""
    if "dalle_pytorch.tokenizer" not in sys.modules:
        stand_ins = []
        for name in ("omegaconf", "taming", "taming.models", "taming.models.vqgan",
                     "pkg_resources", "transformers"):
            if name in sys.modules:
                continue
            try:
                __import__(name)
            except ImportError:
                stand_in = types.ModuleType(name)
                for attr in ("OmegaConf", "VQModel", "GumbelVQ", "BertTokenizer"):
                    setattr(stand_in, attr, object)
                stand_in.get_distribution = lambda *_: None  # type: ignore[attr-defined]
                sys.modules[name] = stand_in
                stand_ins.append(name)
        try:
            import dalle_pytorch.tokenizer  # its package imports with it
        finally:
            for name in stand_ins:
                del sys.modules[name]
    import dalle_pytorch

    assert dalle_pytorch.__version__ == REFERENCE, dalle_pytorch.__version__
    return dalle_pytorch


def saved_like_train_dalle(model: torch.nn.Module, hparams: dict[str, Any],
                           vae_params: dict[str, Any] | None, optimizer: Any = None,
                           scheduler: Any = None, epoch: int = 0,
                           vae_class_name: str = "DiscreteVAE") -> dict[str, Any]:
    """The dict train_dalle.py's save_model writes (1.6.6), for torch.save."""
    return {"hparams": hparams, "vae_params": vae_params, "epoch": epoch,
            "version": REFERENCE, "vae_class_name": vae_class_name,
            "weights": model.state_dict(),
            "opt_state": optimizer.state_dict() if optimizer is not None else None,
            "scheduler_state": scheduler.state_dict() if scheduler is not None else None}


def simple_tokenizer() -> Any:
    """DALLE-pytorch's default tokenizer (dalle_pytorch.tokenizer.tokenizer, CLIP's BPE)."""
    dalle_pytorch()
    from dalle_pytorch.tokenizer import tokenizer

    return tokenizer
