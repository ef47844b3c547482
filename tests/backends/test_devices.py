"""Which device each rank takes, and the refusal of more local ranks than visible GPUs.

There is no GPU here, so no real multi-GPU launch: the decision is a pure function of
counts (rank_device), tested directly, and each backend's select_device is given the
visible GPU count a GPU machine would report (its `gpus` argument; nothing of torch is
patched). That initialize() calls select_device before joining the process group is read
in the code, not tested: it needs a machine with GPUs.
"""

from __future__ import annotations

import pytest
import torch

from dalle_dist.backends.config import DistributedConfig
from dalle_dist.backends.deepspeed import DeepSpeedBackend
from dalle_dist.backends.fsdp import FSDPBackend
from dalle_dist.backends.horovod import HorovodBackend
from dalle_dist.backends.placement import rank_device
from dalle_dist.backends.single import SingleBackend
from dalle_dist.backends.torch_ddp import TorchBackend
from dalle_dist.backends.torch_dist import local_ranks_from_env
from dalle_dist.errors import ConfigError

TORCHRUN = TorchBackend.launch_hint.replace("NAME", "torch")


def test_each_local_rank_takes_its_own_gpu() -> None:
    assert [rank_device(r, 4, 4, TORCHRUN) for r in range(4)] == [
        torch.device("cuda", r) for r in range(4)]
    assert rank_device(1, 2, 8, TORCHRUN) == torch.device("cuda", 1)  # spare GPUs: fine
    assert rank_device(0, 2, 0, TORCHRUN) == torch.device("cpu")  # no GPU: the CPU


def test_more_local_ranks_than_gpus_is_refused_on_every_rank() -> None:
    """Bug caught: `local_rank % device_count` (ranks 2 and 3 silently on GPUs 0 and 1), and
    a check of local_rank >= gpus only, which lets ranks 0 and 1 through to wait in the
    process group for ranks that have gone."""
    messages = set()
    for local_rank in range(4):
        with pytest.raises(ConfigError) as caught:
            rank_device(local_rank, 4, 2, TORCHRUN)
        messages.add(str(caught.value))
    assert len(messages) == 1, "every local rank says the same"
    message = messages.pop()
    assert "\n" not in message
    assert message.startswith("4 ranks on this machine but 2 visible GPU(s)"), message
    assert "torchrun --nproc_per_node 2 -m dalle_dist train --distributed_backend torch" in \
        message
    assert "--device cuda:0" not in message  # no CUDA_VISIBLE_DEVICES: no per-rank binding


def test_without_a_local_count_the_ranks_past_the_last_gpu_refuse() -> None:
    assert rank_device(1, 1, 2, TORCHRUN) == torch.device("cuda", 1)
    with pytest.raises(ConfigError, match="3 ranks on this machine but 2 visible GPU"):
        rank_device(2, 1, 2, TORCHRUN)


def test_one_visible_gpu_per_rank_names_the_explicit_device() -> None:
    """A scheduler that binds each rank to a GPU of its own shows each rank one GPU; the
    user states that with --device cuda:0, which is honoured on every rank."""
    with pytest.raises(ConfigError, match=r"pass --device cuda:0\)$"):
        rank_device(1, 2, 1, TORCHRUN, cuda_visible_devices="3")
    bound = TorchBackend(DistributedConfig(device="cuda:0"))
    bound.local_rank = 1
    assert bound.select_device(2, gpus=1) == torch.device("cuda", 0)


@pytest.mark.parametrize(("backend", "fix"), [
    (TorchBackend, "torchrun --nproc_per_node 2 -m dalle_dist train --distributed_backend torch"),
    (FSDPBackend, "torchrun --nproc_per_node 2 -m dalle_dist train --distributed_backend fsdp"),
    (DeepSpeedBackend, "deepspeed --num_gpus 2 --module dalle_dist train --deepspeed"),
    (HorovodBackend, "horovodrun -np 2 python -m dalle_dist train --distributed_backend horovod"),
])
def test_the_fix_is_the_backends_own_launch_line(backend: type, fix: str) -> None:
    """Bug caught: a fix naming torchrun's flag for a deepspeed or horovod launch."""
    chosen = backend(DistributedConfig())
    chosen.local_rank = 3
    with pytest.raises(ConfigError) as caught:
        chosen.select_device(4, gpus=2)
    assert str(caught.value).endswith(f"one per GPU: {fix})"), str(caught.value)


@pytest.mark.parametrize(("backend", "local_env"), [
    (TorchBackend, "LOCAL_WORLD_SIZE"),  # torchrun's
    (DeepSpeedBackend, "LOCAL_SIZE"),  # the deepspeed launcher's
])
def test_a_machine_short_of_a_gpu_stops_every_rank(backend: type, local_env: str) -> None:
    """Local rank 0 of 3 on a 2-GPU machine (two nodes): it has a GPU, but its machine is
    short of one, so it stops too. Bug caught: the machine's rank count read from
    torchrun's variable only (the deepspeed launcher's is LOCAL_SIZE)."""
    env = {"RANK": "0", "WORLD_SIZE": "6", "LOCAL_RANK": "0", local_env: "3"}
    chosen = backend(DistributedConfig())
    with pytest.raises(ConfigError, match="3 ranks on this machine but 2 visible GPU"):
        chosen.select_device(local_ranks_from_env(env), gpus=2)
    assert not torch.distributed.is_initialized()


def test_the_launchers_local_rank_count() -> None:
    assert local_ranks_from_env({"LOCAL_WORLD_SIZE": "4", "WORLD_SIZE": "8"}) == 4
    assert local_ranks_from_env({"LOCAL_SIZE": "2", "WORLD_SIZE": "8"}) == 2
    assert local_ranks_from_env({"WORLD_SIZE": "8"}) is None  # not the world: other nodes


def test_a_requested_device() -> None:
    """--device cuda:N is honoured as given; bare `cuda` is the rank's own GPU (cuda:0 for
    one process, not the index-less device DDP's device_ids cannot take)."""
    def chosen(device: torch.device | None, gpus: int) -> torch.device:
        return SingleBackend.on(device).select_device(None, gpus=gpus)

    assert chosen(torch.device("cuda"), 2) == torch.device("cuda", 0)
    assert chosen(torch.device("cuda", 1), 2) == torch.device("cuda", 1)
    assert chosen(torch.device("cpu"), 2) == torch.device("cpu")
    assert chosen(None, 2) == torch.device("cuda", 0)
    assert chosen(None, 0) == torch.device("cpu")


def test_an_explicit_gpu_index_under_several_local_ranks_is_refused() -> None:
    """Issue 24: `torchrun --nproc_per_node 8 ... --device cuda:0` put all 8 ranks on GPU 0.
    Every rank of the machine refuses (local rank 0 as well as the others); one visible GPU
    per rank (a scheduler's binding), one rank, or the CPU stay allowed."""
    def chosen(local_rank: int, local_ranks: int | None, gpus: int, device: str) -> torch.device:
        backend = SingleBackend.on(torch.device(device))
        backend.local_rank = local_rank
        return backend.select_device(local_ranks, gpus=gpus)

    for local_rank in range(4):
        with pytest.raises(ConfigError, match="would put every rank on GPU 0") as caught:
            chosen(local_rank, 4, 8, "cuda:0")
        assert "--device cuda" in caught.value.fix
    with pytest.raises(ConfigError, match="GPU 3"):
        chosen(2, None, 8, "cuda:3")  # no local count, but a local rank past 0 shows several
    assert chosen(1, 4, 1, "cuda:0") == torch.device("cuda", 0)  # CUDA_VISIBLE_DEVICES binding
    assert chosen(0, 1, 8, "cuda:5") == torch.device("cuda", 5)  # one rank: any GPU it names
    assert chosen(2, 4, 8, "cpu") == torch.device("cpu")
    assert chosen(2, 4, 8, "cuda") == torch.device("cuda", 2)  # no index: its own GPU
