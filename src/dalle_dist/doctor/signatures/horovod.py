"""Horovod absent, or built without its torch extension or a transport (horovod-not-built).

Ranks 700s. Horovod's stalls and shutdowns are ranks failing to talk (nccl-comm): see
comm.py.
"""

from __future__ import annotations

from dalle_dist.doctor.signatures.base import Signature

SIGNATURES: tuple[Signature, ...] = (
    Signature(
        "horovod-torch-extension", "horovod-not-built",
        (r"Extension horovod\.torch has not been built",
         r"Horovod has not been built with PyTorch support",
         r"backend horovod cannot run here",
         r"module 'horovod\.torch' has no attribute '(?:init|allreduce|size|rank)'",
         r"'NoneType' object has no attribute '(?:init|allreduce|broadcast_parameters|"
         r"broadcast_optimizer_state|DistributedOptimizer|local_rank|size)'",
         # its extension built against another torch than the one importing it
         r"[/\\]horovod[/\\][\w/\\.-]*\.so[.\d]*: undefined symbol"),
        "Horovod is installed without its PyTorch extension (it failed to build, or was "
        "built before this torch)",
        "rebuild it: scripts/build_horovod.sh (HOROVOD_WITH_PYTORCH=1, C++17 against current "
        "torch, --no-build-isolation), then pip install 'dalle_dist[horovod]'",
        "horovodrun --check-build",
        priority=700),
    Signature(
        "horovod-transport-missing", "horovod-not-built",
        (r"(?P<wire>Gloo|MPI) support (?:is required to use elastic training, but )?"
         r"has not been built",
         r"Horovod has not been built with MPI support",
         r"Horovod was built without Gloo and without MPI",
         r"Failed to determine if (?P<wire2>Gloo|MPI) support has been built"),
        "Horovod was built without the transport the launch needs (Gloo or MPI)",
        "rebuild with HOROVOD_WITH_GLOO=1 (scripts/build_horovod.sh), or launch with the "
        "transport it has (horovodrun --gloo / --mpi)",
        "horovodrun --check-build",
        priority=705),
    Signature(
        "horovod-build-failed", "horovod-not-built",
        (r"Failed (?:building wheel for|to build) horovod",
         r"(?:Running setup\.py install|Building wheel) for horovod\b[^\n]*\.\.\. error",
         r"C\+\+17 or later compatible compiler is required",
         r"-- Configuring incomplete, errors occurred!",
         r"CMake Error",
         r"CalledProcessError: Command '\['cmake'",
         r"[/\\]horovod[/\\]setup\.py\", line \d+, in build_extensions"),
        "building Horovod failed; Horovod 0.28.1's CMake asks for C++14 while torch >= 2.1 "
        "headers need C++17",
        "build with scripts/build_horovod.sh (sets CMAKE_CXX_STANDARD 17, "
        "--no-build-isolation) and keep the wheel",
        "horovodrun --check-build",
        requires=(r"(?i)horovod",),
        priority=710),
    Signature(
        "horovod-not-installed", "horovod-not-built",
        (r"No module named '?horovod",
         r"horovodrun: (?:command )?not found",
         r"command not found: horovodrun",
         r"`?horovod`? (?:is not installed|to be installed)",
         r"\bhorovod\s*[<>=!~]=?\s*[\d.]+[^\n]*\bis required\b"),
        "Horovod is not installed in the environment that ran",
        "build and install it: scripts/build_horovod.sh, then pip install "
        "'dalle_dist[horovod]'",
        "horovodrun --check-build",
        priority=715),
)
