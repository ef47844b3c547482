"""A model's initial weights as a stream of full values, one parameter at a time.

Why a stream: a model too large for one rank is built on the meta device (no storage),
sharded, and only then given values (docs/design.md, "Construction"). Each
rank needs, for each parameter in turn, the whole tensor's value to keep its own chunk;
never the whole model. So the values cannot come from modules initialising themselves at
construction (nothing is allocated then), and they must not depend on where they land:
they are drawn from one generator seeded by --seed, parameter after parameter in the
meta model's `named_parameters()` order. A one-process run, a DDP replica and an FSDP
shard therefore hold the same numbers, and the global RNG (dropout, data) is untouched.

The rule per parameter is DALLE's (DALLE-pytorch's): linear and embedding weights
N(0, 0.02), linear biases zero, LayerNorm weight one and bias zero. A parameter of any
other kind of module is refused, so a new module cannot silently train from garbage.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
from torch import nn

INIT_STD = 0.02

#: full values in a model's named_parameters() order: (qualified name, CPU fp32 tensor)
WeightStream = Iterator[tuple[str, torch.Tensor]]


def initial_value(module: nn.Module, name: str, shape: torch.Size,
                  generator: torch.Generator | None = None) -> torch.Tensor:
    """The initial value of `module`'s own parameter `name`, on the CPU in fp32 (whatever
    default device is set: a CPU generator draws it)."""
    if isinstance(module, (nn.Linear, nn.Embedding)) and name == "weight":
        return torch.empty(shape, device="cpu").normal_(0.0, INIT_STD, generator=generator)
    if isinstance(module, nn.Linear) and name == "bias":
        return torch.zeros(shape, device="cpu")
    if isinstance(module, nn.LayerNorm):
        return (torch.ones if name == "weight" else torch.zeros)(shape, device="cpu")
    if name == "scale" and hasattr(module, "initial"):  # transformer.LayerScale
        return torch.full(shape, float(module.initial), device="cpu")
    raise TypeError(f"no initial value for {type(module).__name__}.{name}: "
                    "say how model/init.py initialises it")


def owned_parameters(model: nn.Module) -> list[tuple[str, nn.Module, str]]:
    """(qualified name, owning module, own name) of each parameter once, in
    `model.named_parameters()` order (a shared or tied parameter under its first name)."""
    owners = {id(p): (module, own) for _, module in model.named_modules()
              for own, p in module.named_parameters(recurse=False)}
    return [(name, *owners[id(p)]) for name, p in model.named_parameters()]


def initial_weights(model: nn.Module, seed: int) -> WeightStream:
    """`model`'s initial weights, drawn from a generator seeded with `seed`, one full
    parameter at a time. `model` may be on the meta device: only its shapes are read."""
    generator = torch.Generator().manual_seed(seed)
    for name, module, own in owned_parameters(model):
        yield name, initial_value(module, own, getattr(module, own).shape, generator)


#: elements of each parameter that ranks compare before training (its first ones)
HEAD_ELEMENTS = 64


def with_heads(weights: WeightStream, heads: dict[str, bytes]) -> WeightStream:
    """`weights`, passing through, with the bytes of the first HEAD_ELEMENTS of each value
    kept in `heads`: what ranks that fill their own shards compare to know they used the
    same values (the same --seed, the same checkpoint), without moving the weights.

    Bytes, not tensor copies: a small tensor kept alive between two full parameters sits
    in the C heap above the first one's freed block, so the heap cannot give it back and
    grows at the next. Seen: one FSDP rank of two peaked 390 MB higher at start-up
    (bench/startup_memory.py, a 529 MB model) with 64-element clones kept here."""
    for name, value in weights:
        heads[name] = value.detach().reshape(-1)[:HEAD_ELEMENTS].float().numpy().tobytes()
        yield name, value


def checkpoint_weights(model: nn.Module, state: dict[str, torch.Tensor]) -> WeightStream:
    """A checkpoint's weights (a state dict, possibly memory-mapped) as a stream in
    `model`'s order; a missing or extra key fails here as load_state_dict would."""
    names = [name for name, _ in model.named_parameters()]
    expected = set(model.state_dict())
    missing, unexpected = expected - set(state), set(state) - expected
    if missing or unexpected:
        raise RuntimeError(f"the checkpoint's weights do not fit the model: missing "
                           f"{sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]}")
    return ((name, state[name]) for name in names)


def built_on_meta(model: nn.Module) -> bool:
    """Whether `model` still waits for its values (built by on_meta, not yet filled)."""
    return any(param.is_meta for param in model.parameters())


def on_meta(build: Callable[[], nn.Module]) -> nn.Module:
    """`build()` on the meta device: shapes and structure, no storage, no random draws."""
    with torch.device("meta"):
        return build()


def materialise(model: nn.Module, weights: WeightStream,
                device: torch.device | str = "cpu") -> nn.Module:
    """A meta-built `model` allocated on `device` and filled from `weights`, in place."""
    if any(b.is_meta for b in model.buffers()):
        raise ValueError("a module with buffers cannot be built on the meta device: "
                         "its buffers would have no values")
    model.to_empty(device=device)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, value in weights:
            params.pop(name).copy_(value)
    if params:
        raise RuntimeError(f"no value for {sorted(params)[:5]}")
    return model


def placed(model: nn.Module, weights: WeightStream | None,
           device: torch.device | str) -> nn.Module:
    """`model` on `device`: a meta-built one allocated there and filled from `weights`
    (no full copy on the CPU first), a built one (weights None) moved."""
    if weights is None:
        return model.to(device)
    return materialise(model, weights, device)
