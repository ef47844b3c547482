"""Discrete VAE: images <-> a grid of codebook indices (DALL-E's dVAE, Gumbel-softmax)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dalle_dist.model.config import VAEConfig


class ResBlock(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(channels, channels, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(channels, channels, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(channels, channels, 1),
        )

    def forward(self, x: Tensor) -> Tensor:
        return x + self.net(x)


class DiscreteVAE(nn.Module):
    """Conv encoder -> logits over `num_tokens` per cell -> codebook -> conv decoder.

    Images enter and leave in [0, 1]; inside they are scaled to [-1, 1].
    Training samples the codebook with Gumbel-softmax at a temperature the caller anneals;
    `get_codebook_indices` takes the argmax, which is what DALL-E trains on.
    """

    def __init__(self, config: VAEConfig) -> None:
        super().__init__()
        config.validate()
        self.config = config
        hidden = config.hidden_dim

        encoder: list[nn.Module] = []
        in_ch = config.channels
        for _ in range(config.num_layers):
            encoder += [nn.Conv2d(in_ch, hidden, 4, stride=2, padding=1), nn.ReLU()]
            in_ch = hidden
        encoder += [ResBlock(hidden) for _ in range(config.num_resnet_blocks)]
        encoder.append(nn.Conv2d(hidden, config.num_tokens, 1))
        self.encoder = nn.Sequential(*encoder)

        decoder: list[nn.Module] = []
        in_ch = config.codebook_dim
        if config.decoder_stem:
            decoder.append(nn.Conv2d(config.codebook_dim, hidden, 1))
            in_ch = hidden
        decoder += [ResBlock(hidden) for _ in range(config.num_resnet_blocks)]
        for _ in range(config.num_layers):
            decoder += [nn.ConvTranspose2d(in_ch, hidden, 4, stride=2, padding=1), nn.ReLU()]
            in_ch = hidden
        decoder.append(nn.Conv2d(hidden, config.channels, 1))
        self.decoder = nn.Sequential(*decoder)

        self.codebook = nn.Embedding(config.num_tokens, config.codebook_dim)

    @staticmethod
    def _normalize(images: Tensor) -> Tensor:
        return images * 2.0 - 1.0

    @staticmethod
    def _denormalize(x: Tensor) -> Tensor:
        return ((x + 1.0) * 0.5).clamp(0.0, 1.0)

    @torch.no_grad()
    def get_codebook_indices(self, images: Tensor) -> Tensor:
        """[b, channels, H, W] in [0, 1] -> [b, fmap*fmap] token ids, row-major (channels:
        3 RGB, 4 RGBA with --transparent)."""
        logits = self.encoder(self._normalize(images))
        return logits.argmax(dim=1).flatten(1)

    def decode(self, indices: Tensor) -> Tensor:
        """[b, fmap*fmap] token ids -> [b, channels, H, W] in [0, 1]."""
        side = self.config.fmap_size
        codes = self.codebook(indices).view(indices.shape[0], side, side, -1)
        return self._denormalize(self.decoder(codes.permute(0, 3, 1, 2)))

    def forward(self, images: Tensor, temperature: float = 1.0) -> dict[str, Tensor]:
        """Returns the loss to minimise, its parts, and the (soft) reconstructions."""
        cfg = self.config
        target = self._normalize(images)
        logits = self.encoder(target)
        soft_one_hot = F.gumbel_softmax(logits, tau=temperature, dim=1, hard=cfg.straight_through)
        codes = torch.einsum("bnhw,nd->bdhw", soft_one_hot, self.codebook.weight)
        out = self.decoder(codes)

        loss_fn = F.smooth_l1_loss if cfg.smooth_l1_loss else F.mse_loss
        recon_loss = loss_fn(out, target)

        # KL between the encoder's code distribution and a uniform prior, per cell.
        log_qy = F.log_softmax(logits.flatten(2).transpose(1, 2), dim=-1)
        log_uniform = torch.full_like(log_qy, -torch.log(torch.tensor(float(cfg.num_tokens))))
        kl = F.kl_div(log_uniform, log_qy, reduction="batchmean", log_target=True)
        loss = recon_loss + cfg.kl_loss_weight * kl
        return {
            "loss": loss,
            "recon_loss": recon_loss.detach(),
            "kl": kl.detach(),
            "recons": self._denormalize(out.detach()),
        }
